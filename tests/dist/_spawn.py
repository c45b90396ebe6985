"""Run a function on N real gloo ranks: processes from a forkserver, torchrun-style variables, a free port.

The function must live at module level in an importable module (it is pickled by name) and
is called as ``fn(rank, world_size, *args)``. Its return value (picklable) comes back per rank. Every process group
gets a 60 s timeout, so a rank that misses a collective fails the test instead of hanging it.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

TIMEOUT_S = 60

# Ranks are forked from a forkserver that has imported these once per pytest session: a spawned process pays
# ~5 s of imports (much more on a busy 2-core machine), a fork from the preloaded server almost nothing. The
# server never runs torch ops itself, so forking it is safe (no OpenMP pool to inherit).
_PRELOAD = ["torch", "torch.distributed.fsdp", "torch.distributed.checkpoint", "transformers",
            "transformers.models.qwen2.modeling_qwen2", "hpcppo.distributed.fsdp", "hpcppo.distributed.checkpoint",
            "hpcppo.distributed.weights", "hpcppo.distributed.mesh"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn: Callable[..., Any], world_size: int, port: int, out_dir: str, args: tuple) -> None:
    # Variables as torchrun would export them: the workers go through detect_env + init_distributed for real.
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # N ranks share 2 cores; oversubscription makes gloo tests crawl

    from hpcppo.distributed.env import destroy_distributed, detect_env, init_distributed

    init_distributed(detect_env(os.environ, device_type="cpu"), timeout_s=TIMEOUT_S)
    finished = False
    try:
        result = fn(rank, world_size, *args)
        finished = True
    finally:
        # As the job entry point does: ranks that finished leave together (a failed rank's error propagates).
        destroy_distributed(sync_timeout_s=TIMEOUT_S if finished else None)
    with open(Path(out_dir) / f"result-{rank}.pkl", "wb") as f:
        pickle.dump(result, f)
        f.flush()
        os.fsync(f.fileno())
    # The result is on disk: skip the interpreter's teardown, where native thread pools (gloo, Arrow) can abort
    # a process that did everything right (hpcppo.train.main leaves the same way).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any) -> list[Any]:
    """Run ``fn`` on ``world_size`` gloo ranks and return the per-rank results (rank order).

    An exception on any rank is re-raised here with that rank's traceback.
    """
    with tempfile.TemporaryDirectory(prefix="hpcppo-dist-") as out_dir:
        multiprocessing.set_forkserver_preload(_PRELOAD)
        mp.start_processes(_entry, args=(fn, world_size, free_port(), out_dir, args), nprocs=world_size, join=True,
                           start_method="forkserver")
        results = []
        for rank in range(world_size):
            with open(Path(out_dir) / f"result-{rank}.pkl", "rb") as f:
                results.append(pickle.load(f))
        return results
