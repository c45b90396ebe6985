"""Smoke test of tools/bench_train.py: one real run with the smallest budget, its figures sane and complete."""

from __future__ import annotations

import json
import math
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
    # 0 = PASS, 3 = FAIL of the overhead check; anything else (1: a traceback) is a crash.
    assert proc.returncode in (0, 3), proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    for section in ("phase (s, median)", "throughput", "update phase", "matmul peak", "weight sync", "checkpoint (DCP",
                    "one actor mini-batch update", "overhead vs the minimal PPO loop"):
        assert section in text, f"missing {section!r} in:\n{text}"
    r = json.loads(out.read_text())
    assert r["pass"] == (proc.returncode == 0) == ("-> PASS" in text)
    assert r["response_widths"] == {"hpcppo": [16], "minimal": [16]}
    assert len(r["iterations_s"]["hpcppo"]) == len(r["iterations_s"]["minimal"]) == 2
    for side in ("hpcppo", "minimal"):
        for phase in ("generate", "old_logprob", "ref", "values", "critic_update", "actor_update"):
            assert 0 < r["phases_s"][side][phase] < 60, (side, phase)
    for phase in ("weight_sync", "checkpoint"):
        assert 0 < r["phases_s"]["hpcppo"][phase] < 60, phase
    assert math.isclose(r["overhead_ratio"], r["iteration_s"]["hpcppo"] / r["iteration_s"]["minimal"])
    assert 400_000 < r["params"]["actor"] < 600_000 and r["params"]["critic"] == r["params"]["actor"] + 129
    # the checkpoint holds at least both models' float32 weights and their two AdamW moments
    assert r["checkpoint"]["bytes"] >= 3 * 4 * (r["params"]["actor"] + r["params"]["critic"])
    assert r["weight_sync"]["bytes"] == 4 * r["params"]["actor"]
    u = r["update"]
    assert u["flops"] == 6 * (r["params"]["actor"] + r["params"]["critic"]) * r["shape"]["samples"] * r["shape"]["width"]
    assert 0 < u["flops"] / u["hpcppo_s"] < u["matmul_peak_flops_per_s"] * 1.5
