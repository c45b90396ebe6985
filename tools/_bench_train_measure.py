"""The micro-benchmarks of tools/bench_train.py: the reference rates its ratios divide by, and an update breakdown.

A helper module of the benchmark script (tools/ is not a package: the script's directory is on sys.path).
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch
from _bench_train_workload import RESPONSE_LEN


def best_time(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def matmul_peak(n: int = 1024) -> float:
    """FLOP/s of a float32 n x n matmul on the current threads (best of several)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    return 2 * n**3 / best_time(lambda: torch.mm(a, b, out=out), 5)


def copy_rate(nbytes: int) -> float:
    """Bytes/s of a plain tensor copy of ``nbytes`` (median of many: the buffer is small)."""
    src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    dst.copy_(src)
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times)


def file_write_rate(directory: Path, nbytes: int) -> float:
    """Bytes/s of writing ``nbytes`` to a new file + fsync (median of 5), in the run's directory."""
    data = os.urandom(nbytes)
    times = []
    for i in range(5):
        path = directory / f"write-probe-{i}.bin"
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        times.append(time.perf_counter() - t0)
        path.unlink()
    return nbytes / statistics.median(times)


def update_breakdown(models: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]], rows: int, width: int,
                     vocab: int, reps: int = 6) -> dict[str, dict[str, float]]:
    """Median ms of the pieces of one actor mini-batch update (forward to log-probs, backward, grad clip, AdamW
    step) for each (model, optimizer), alternating between them; random token ids, the same for all. Run after
    training (it moves the weights)."""
    from hpcppo.models import forward_log_probs

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, width), generator=g)
    att, pos = torch.ones_like(ids), torch.arange(width).expand(rows, width)
    times: dict[str, dict[str, list[float]]] = {k: {} for k in models}
    for rep in range(reps + 1):
        for name, (model, opt) in models.items():
            marks = [time.perf_counter()]
            lp, _ = forward_log_probs(model, ids, att, pos, RESPONSE_LEN)
            loss = lp.mean()
            marks.append(time.perf_counter())
            loss.backward()
            marks.append(time.perf_counter())
            norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], 1.0)
            float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
            marks.append(time.perf_counter())
            opt.step()
            opt.zero_grad(set_to_none=True)
            marks.append(time.perf_counter())
            if rep:  # the first round warms up
                for part, a, b in zip(("forward", "backward", "clip", "optim_step"), marks, marks[1:]):
                    times[name].setdefault(part, []).append(b - a)
    return {name: {part: 1e3 * statistics.median(v) for part, v in parts.items()} for name, parts in times.items()}


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights once; DTensors report the global size
