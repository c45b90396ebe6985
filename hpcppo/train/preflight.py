"""``hpcppo preflight``: a short distributed job through the whole launch path.

Each rank initialises torch.distributed from the job environment (gloo on CPU, NCCL on GPUs), checks
the world size and the set of ranks, runs an all-reduce correctness check and a small bandwidth sweep,
and records its host, visible GPUs, the versions of Python, torch, CUDA, transformers and vLLM and which paths it can write. Rank 0 writes
``preflight.json`` into the run directory (atomically). Exit 0 when every check passed.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpcppo.distributed.env import DistEnv
from hpcppo.fsutil import atomic_write_json
from hpcppo.rundir import RunPaths
from hpcppo.train.versions import runtime_versions

# Message sizes of the bandwidth sweep (bytes of float32 payload).
SWEEP_BYTES = (4 << 10, 64 << 10, 1 << 20, 8 << 20)
SWEEP_ITERS = 5


def _host() -> str:
    # Emulated Slurm nodes share the real hostname; SLURMD_NODENAME is the node's Slurm name.
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _writable(path: Path) -> dict[str, Any]:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".preflight-") as f:
            f.write(b"x" * 4096)
            f.flush()
            os.fsync(f.fileno())
        return {"path": str(path), "ok": True}
    except OSError as exc:
        return {"path": str(path), "ok": False, "error": f"{type(exc).__name__}: {exc}"}


def _gpu_info() -> dict[str, Any]:
    info: dict[str, Any] = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if torch.cuda.is_available():
        info["count"] = torch.cuda.device_count()
        info["names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["current"] = torch.cuda.current_device()
    else:
        info["count"] = 0
    return info


def _allreduce_check(device: torch.device, world: int, rank: int) -> dict[str, Any]:
    """Sum of ``rank+1`` over ranks, and a seeded random tensor checked against an all_gather sum."""
    t = torch.full((1024,), float(rank + 1), device=device)
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    ok_const = bool(torch.all(t == expected))
    g = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(4096, generator=g).to(device)
    gathered = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(gathered, x)
    reference = torch.stack(gathered).sum(0)
    dist.all_reduce(x)
    max_err = float((x - reference).abs().max())
    return {"ok": ok_const and max_err < 1e-4, "constant_sum": ok_const, "random_max_abs_err": max_err}


def _bandwidth_sweep(device: torch.device, world: int) -> list[dict[str, float]]:
    rows = []
    for nbytes in SWEEP_BYTES:
        t = torch.ones(nbytes // 4, device=device)
        dist.all_reduce(t)  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(SWEEP_ITERS):
            dist.all_reduce(t)
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = (time.perf_counter() - start) / SWEEP_ITERS
        algbw = nbytes / elapsed
        # bus bandwidth as nccl-tests defines it for all-reduce: algbw * 2(n-1)/n
        rows.append({"bytes": nbytes, "time_s": elapsed, "algbw_GBps": algbw / 1e9, "busbw_GBps": algbw * 2 * (world - 1) / max(world, 1) / 1e9})
    return rows


def run_preflight(env: DistEnv, run_dir: Path, expected_world_size: int, extra_paths: list[str]) -> int:
    device = torch.device("cuda", env.device_index) if env.device_type == "cuda" else torch.device("cpu")
    started = time.time()
    record: dict[str, Any] = {
        "rank": env.rank,
        "local_rank": env.local_rank,
        "host": _host(),
        "pid": os.getpid(),
        **runtime_versions(),  # python, platform, torch, cuda, transformers, vllm
        "gpus": _gpu_info(),
        "paths": [_writable(Path(p)) for p in [str(RunPaths(run_dir).checkpoints), tempfile.gettempdir(),
                                                *extra_paths]],
        "slurm": {k: v for k, v in os.environ.items() if k in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NODEID", "SLURMD_NODENAME", "SLURM_RESTART_COUNT")},
    }
    world_ok = dist.get_world_size() == expected_world_size
    ranks: list[int] = [0] * dist.get_world_size()  # filled by the gather
    dist.all_gather_object(ranks, env.rank)
    record["allreduce"] = _allreduce_check(device, dist.get_world_size(), env.rank)
    sweep = _bandwidth_sweep(device, dist.get_world_size())
    records: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(records, record)
    checks: dict[str, dict[str, Any]] = {
        "world_size": {"ok": world_ok, "expected": expected_world_size, "actual": dist.get_world_size()},
        "ranks": {"ok": sorted(ranks) == list(range(dist.get_world_size())), "seen": sorted(ranks)},
        "allreduce": {"ok": all(r["allreduce"]["ok"] for r in records)},
        "paths": {"ok": all(p["ok"] for r in records for p in r["paths"])},
    }
    ok = all(c["ok"] for c in checks.values())
    if env.rank == 0:
        atomic_write_json(
            RunPaths(run_dir).preflight,
            {
                "ok": ok,
                "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "wall_s": time.time() - started,
                "backend": dist.get_backend(),
                "world_size": dist.get_world_size(),
                "master": f"{env.master_addr}:{env.master_port}",
                "nodes": sorted({r["host"] for r in records}),
                "checks": checks,
                "bandwidth": sweep,
                "ranks": sorted(records, key=lambda r: r["rank"]),
            },
        )
        print(f"preflight: {'OK' if ok else 'FAILED'} world={dist.get_world_size()} nodes={sorted({r['host'] for r in records})}", flush=True)
    dist.barrier()
    return 0 if ok else 1
