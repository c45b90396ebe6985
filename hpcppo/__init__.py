"""hpcppo: PPO RLHF for large language models on Slurm clusters, driven by a config compiler."""

__version__ = "0.1.0"
