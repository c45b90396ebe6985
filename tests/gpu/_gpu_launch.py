"""Start GPU scenarios as real processes, one per rank, and read back what they measured.

Each scenario (``_gpu_scenarios.py``) runs in fresh processes: NCCL communicators, CUDA contexts and vLLM's
global parallel state never leak from one check into the next, and a crash or hang fails one test, not the
session. Ranks get torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), which both ``hpcppo.distributed.env.detect_env`` and vLLM's ``external_launcher`` read. Only stdlib and
pytest are imported at module level, so collection works on a machine without CUDA or vLLM.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = Path(__file__).with_name("_gpu_scenarios.py")
LOG_TAIL = 6000


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cuda_device_count() -> int:
    """The visible GPUs; fails the test (never skips) when CUDA is unusable, since a gpu-marked test only runs
    where a GPU is expected (CI deselects them with ``-m "not gpu"``)."""
    import torch

    if not torch.cuda.is_available():
        pytest.fail(f"no usable CUDA device (torch {torch.__version__}, built for CUDA {torch.version.cuda}); "
                    "gpu-marked tests need one: deselect them with -m 'not gpu' on CPU machines")
    return torch.cuda.device_count()


def require_gpus(n: int) -> None:
    """Skip, naming both counts, when this machine has fewer than ``n`` GPUs (NCCL refuses two ranks on one GPU)."""
    have = cuda_device_count()
    if have < n:
        pytest.skip(f"needs {n} GPUs (one NCCL rank per GPU); this machine has {have}")


def require_vllm() -> None:
    """Fail (not skip) when vLLM cannot be imported: the check was asked for and cannot run here."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.fail(f"vllm is not importable by {sys.executable}: install the extra (pip install 'hpcppo[vllm]') in "
                    "the GPU environment, or deselect these checks with -m 'gpu and not vllm'")


def child_env(rank: int, world: int, port: int, **extra: str) -> dict[str, str]:
    """This process's environment plus torchrun's variables for ``rank``; the checkout first on PYTHONPATH so a
    child imports the hpcppo under test even where it is not pip-installed (the device image)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                PYTHONPATH=path, PYTHONUNBUFFERED="1", **extra)


def log_tail(path: Path) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return f"==> {path}\n{text[-LOG_TAIL:]}"


def run_processes(cmd: list[str], world: int, log_dir: Path, name: str, *, timeout_s: float,
                  extra_env: dict[str, str] | None = None) -> None:
    """Run ``cmd`` once per rank (cwd: the repository) and fail with every rank's log tail unless all exit 0
    within ``timeout_s``; a rank that hangs is killed with the others."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs: list[tuple[subprocess.Popen, Path]] = []
    for rank in range(world):
        log = log_dir / f"{name}-rank{rank}.log"
        with open(log, "wb") as fh:
            env = child_env(rank, world, port, **(extra_env or {}))
            procs.append((subprocess.Popen(cmd, env=env, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + timeout_s
    codes: list[int | None] = []
    try:
        for proc, _ in procs:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        for proc, _ in procs:
            proc.kill()
        for proc, _ in procs:
            proc.wait()
        logs = "\n".join(log_tail(log) for _, log in procs)
        pytest.fail(f"{name}: ranks still running after {timeout_s:.0f} s, killed\n{logs}")
    if any(codes):
        logs = "\n".join(log_tail(log) for _, log in procs)
        pytest.fail(f"{name}: exit codes {codes} (rank order)\n{logs}")


def run_scenario(name: str, world: int, out_dir: Path, *args: str, timeout_s: float) -> list[dict[str, Any]]:
    """Run scenario ``name`` of ``_gpu_scenarios.py`` on ``world`` ranks; returns each rank's saved result."""
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    run_processes([sys.executable, str(SCENARIOS), name, str(out_dir), *args], world, out_dir, name,
                  timeout_s=timeout_s)
    results = []
    for rank in range(world):
        path = out_dir / f"result-{rank}.pt"
        if not path.is_file():
            log = log_tail(out_dir / f"{name}-rank{rank}.log")
            pytest.fail(f"{name}: rank {rank} exited 0 but wrote no {path.name}\n{log}")
        results.append(torch.load(path, weights_only=True))
    return results
