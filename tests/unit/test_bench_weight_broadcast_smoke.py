"""Smoke test of tools/bench_weight_broadcast.py: a tiny real run of the three processes reports both comparisons,
and every ratio printed is the one the measured rounds give."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_weight_broadcast_tiny_run_reports_both_comparisons(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_weight_broadcast.py"), "--mb", "3",
                           "--bucket-mb", "0.5", "--hidden", "64", "--layers", "1", "--vocab", "256", "--rounds",
                           "1", "--warmup", "0", "--timeout", "120", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    sides = ({f"{kind}-{b}" for kind in ("bridge", "load", "sync") for b in (1 << 19,)}
             | {"plain", "sync-plain", "gather"})
    assert set(r["rounds"]) == sides and all(len(v) == 1 and min(v) > 0 for v in r["rounds"].values())
    for name, ratio in r["ratios"].items():
        plain = r["rounds"]["sync-plain" if name.startswith(("sync", "gather")) else "plain"]
        per = [p / q for p, q in zip(plain, r["rounds"][name])]
        assert ratio["median"] == pytest.approx(statistics.median(per)) and ratio["min"] == pytest.approx(min(per))
    assert "bridge / plain" in proc.stdout and "sync / plain" in proc.stdout
    assert r["bytes"] >= 3 << 20 and r["model_bytes"] > 0
