"""Smoke test of tools/bench_train.py: one real run with the smallest budget, its figures sane and complete."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_train_runs_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_train.py"), "--steps", "2", "--warmup", "1", "--threads", "1",
         "--json", str(out), "--keep", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    for section in ("phase (s, median)", "throughput", "update phase", "matmul peak", "weight sync", "checkpoint (DCP",
                    "one actor mini-batch update", "tools/bench_peers.py"):
        assert section in text, f"missing {section!r} in:\n{text}"
    assert "minimal" not in text  # the comparison with other loops is bench_peers' alone
    r = json.loads(out.read_text())
    assert r["response_widths"] == [16]
    assert len(r["steps_s"]) == 2
    for phase in ("weight_sync", "generate", "old_logprob", "ref", "values", "critic_update", "actor_update",
                  "checkpoint"):
        assert 0 < r["phases_s"][phase] < 60, phase
    assert math.isclose(r["step_time_s"], statistics.median(r["steps_s"]))
    assert 400_000 < r["params"]["actor"] < 600_000 and r["params"]["critic"] == r["params"]["actor"] + 129
    # the checkpoint holds at least both models' float32 weights and their two AdamW moments
    assert r["checkpoint"]["bytes"] >= 3 * 4 * (r["params"]["actor"] + r["params"]["critic"])
    assert r["weight_sync"]["bytes"] == 4 * r["params"]["actor"]
    u = r["update"]
    assert u["flops"] == 6 * (r["params"]["actor"] + r["params"]["critic"]) * r["shape"]["samples"] * r["shape"]["width"]
    assert 0 < u["flops"] / u["s"] < u["matmul_peak_flops_per_s"] * 1.5
    assert set(r["update_breakdown_ms"]) == {"hpcppo actor (as built)", "plain HF actor"}
    for parts in r["update_breakdown_ms"].values():
        assert set(parts) == {"forward", "backward", "clip", "optim_step"} and all(v > 0 for v in parts.values())
