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
from typing import Any, Callable

import pytest

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = Path(__file__).with_name("_gpu_scenarios.py")
LOG_TAIL = 6000
# ``HPCPPO_GPU_SCENARIO_DEVICE=cpu`` runs the scenarios and the trainer legs on gloo/CPU: only to check this folder's
# code on a machine without a GPU (the CUDA-only figures are then absent or differ); tools/gpu_check.sh never sets it.
DEVICE = os.environ.get("HPCPPO_GPU_SCENARIO_DEVICE", "cuda")
# pytest-timeout's per-test limit (tools/gpu_check.sh sets both): the child processes of a test are given what is
# left of it, less a margin, so that their own timeout fires first and the test shows every rank's log.
TEST_TIMEOUT_S = float(os.environ.get("HPCPPO_GPU_TEST_TIMEOUT_S", "600"))
MARGIN_S = 15.0
_item_started = time.monotonic()


def item_started() -> None:
    """Called by conftest.py as each test's setup begins (fixtures included, as pytest-timeout counts them)."""
    global _item_started
    _item_started = time.monotonic()


def budget(timeout_s: float) -> float:
    """``timeout_s``, cut to what is left of the test's own limit less a margin; fails the test when nothing is."""
    left = TEST_TIMEOUT_S - (time.monotonic() - _item_started) - MARGIN_S
    if left < 10:
        pytest.fail(f"only {left:.0f} s of the {TEST_TIMEOUT_S:.0f} s per-test limit left to start a child: "
                    "raise HPCPPO_GPU_TEST_TIMEOUT_S (tools/gpu_check.sh)")
    return min(timeout_s, left)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cuda_device_count() -> int:
    """The visible GPUs; fails the test (never skips) when CUDA is unusable, since a gpu-marked test only runs
    where a GPU is expected (CI deselects them with ``-m "not gpu"``). In the CPU check mode (``DEVICE``): 1."""
    import torch

    if DEVICE == "cpu":
        return 1
    if not torch.cuda.is_available():
        pytest.fail(f"no usable CUDA device (torch {torch.__version__}, built for CUDA {torch.version.cuda}); "
                    "gpu-marked tests need one: deselect them with -m 'not gpu' on CPU machines")
    return torch.cuda.device_count()


def require_gpus(n: int) -> None:
    """Fail, naming both counts, when this machine has fewer than ``n`` GPUs (NCCL refuses two ranks on one GPU).
    Checks of several GPUs are marked ``multi_gpu``: tools/gpu_check.sh deselects them on a 1-GPU machine."""
    have = cuda_device_count()
    if have < n:
        pytest.fail(f"needs {n} GPUs (one NCCL rank per GPU); this machine has {have}: deselect with -m 'not multi_gpu'")


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


def _kill(procs: list[tuple[subprocess.Popen, Path]]) -> None:
    for proc, _ in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_processes(cmd: list[str], world: int, log_dir: Path, name: str, *, timeout_s: float,
                  extra_env: dict[str, str] | None = None) -> None:
    """Run ``cmd`` once per rank (cwd: the repository) and fail with every rank's log tail unless all exit 0
    within ``timeout_s``; a rank that hangs is killed with the others."""
    log_dir.mkdir(parents=True, exist_ok=True)
    timeout_s = budget(timeout_s)
    port = free_port()
    procs: list[tuple[subprocess.Popen, Path]] = []
    codes: list[int | None] = []
    try:
        for rank in range(world):
            log = log_dir / f"{name}-rank{rank}.log"
            with open(log, "wb") as fh:
                env = child_env(rank, world, port, **(extra_env or {}))
                procs.append((subprocess.Popen(cmd, env=env, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT), log))
        deadline = time.monotonic() + timeout_s
        for proc, _ in procs:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        _kill(procs)
        logs = "\n".join(log_tail(log) for _, log in procs)
        pytest.fail(f"{name}: ranks still running after {timeout_s:.0f} s, killed\n{logs}")
    finally:  # also on KeyboardInterrupt (gpu_check.sh stops pytest with SIGINT) and pytest-timeout: no orphans
        _kill(procs)
    if any(codes):
        logs = "\n".join(log_tail(log) for _, log in procs)
        pytest.fail(f"{name}: exit codes {codes} (rank order)\n{logs}")


def scenario_main(argv: list[str], name: str, scenario: Callable[[Path], dict[str, Any]]) -> int:
    """The command line of a one-rank scenario in its own test file (``run_scenario(name, 1, ..., script=<file>)``):
    ``NAME OUT_DIR`` runs ``scenario(OUT_DIR)`` in this process and saves what it returns as ``OUT_DIR/result-0.pt``,
    atomically (a rank that dies leaves none); the process group is destroyed either way."""
    import torch

    from hpcppo.distributed.env import destroy_distributed

    if argv[:1] != [name] or len(argv) != 2:
        print(f"usage: {Path(sys.argv[0]).name} {name} OUT_DIR", file=sys.stderr)
        return 2
    out_dir = Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = scenario(out_dir)
        tmp = out_dir / ".result-0.pt.tmp"
        torch.save(result, tmp)
        os.replace(tmp, out_dir / "result-0.pt")
    finally:
        destroy_distributed()
    return 0


def run_scenario(name: str, world: int, out_dir: Path, *args: str, timeout_s: float,
                 script: Path = SCENARIOS, extra_env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run scenario ``name`` of ``script`` (``script NAME OUT_DIR ARGS...``) on ``world`` ranks; returns each rank's
    saved ``result-<rank>.pt``."""
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    run_processes([sys.executable, str(script), name, str(out_dir), *args], world, out_dir, name,
                  timeout_s=timeout_s, extra_env=extra_env)
    results = []
    for rank in range(world):
        path = out_dir / f"result-{rank}.pt"
        if not path.is_file():
            log = log_tail(out_dir / f"{name}-rank{rank}.log")
            pytest.fail(f"{name}: rank {rank} exited 0 but wrote no {path.name}\n{log}")
        results.append(torch.load(path, weights_only=True))
    return results
