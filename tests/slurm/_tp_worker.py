"""One rank of the cross-node TP=2 rollout check, started by ``srun`` in a job on the GPU-shaped partition.

    python -u tests/slurm/_tp_worker.py OUT_DIR TP

The rank finds its place from Slurm's variables alone (``detect_env``: SLURM_PROCID, SLURM_LOCALID, ...; the
batch script's MASTER_ADDR/PORT), joins the gloo group over both nodes, and runs the trainer's own rollout and
validation with ``tensor_parallel_size = TP`` through ``tests/dist/test_rollout_tp_groups._worker`` (the 4-rank
single-machine check of the same code; the engine there is ``VLLMRolloutEngine`` over the *recording stand-in*
``tests/_fakes/recording_vllm``, NOT vLLM). It writes ``OUT_DIR/rank-<R>.json``: what it asked the engine for,
its training share, its validation result, its Slurm identity and the launcher variables vLLM would read.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "dist"))

import torch  # noqa: E402

from hpcppo.distributed.env import destroy_distributed, detect_env, init_distributed  # noqa: E402
from hpcppo.fsutil import atomic_write_json  # noqa: E402

TIMEOUT_S = 120


def main(out_dir: Path, tp: int) -> None:
    torch.set_num_threads(1)  # 16 ranks on 2 cores
    env = detect_env(os.environ, device_type="cpu")
    init_distributed(env, timeout_s=TIMEOUT_S)
    from test_rollout_tp_groups import _worker

    result = _worker(env.rank, env.world_size, tp)
    result["slurm"] = {k: os.environ.get(k) for k in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID",
                                                      "SLURMD_NODENAME", "CUDA_VISIBLE_DEVICES")}
    result["env"] = {"rank": env.rank, "local_rank": env.local_rank, "world_size": env.world_size,
                     "local_world_size": env.local_world_size, "node_rank": env.node_rank, "source": env.source}
    destroy_distributed(sync_timeout_s=TIMEOUT_S)
    atomic_write_json(out_dir / f"rank-{env.rank}.json", result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as hpcppo.train.main: skip the teardown where gloo's threads can abort a finished process


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
