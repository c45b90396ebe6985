"""Rollout engines: sample responses from the current policy.

``factory`` builds one by name, ``base`` holds the protocol and the batch conventions (read its docstring first), ``hf`` the CPU-testable
Hugging Face engine, ``vllm_engine`` the colocated vLLM engine (lazy import; GPU nodes only); ``agent_loop`` how a step's prompts become
samples, ``source`` where and when (the colocated source: wake, sync, loop, sleep; docs/rollout-phase.md).
"""

from hpcppo.rollout.base import EngineSettings, RolloutBatch, RolloutEngine, SamplingParams, derive_seed
from hpcppo.rollout.factory import ENGINE_KINDS, build_engine

__all__ = ["ENGINE_KINDS", "EngineSettings", "RolloutBatch", "RolloutEngine", "SamplingParams", "build_engine", "derive_seed"]
