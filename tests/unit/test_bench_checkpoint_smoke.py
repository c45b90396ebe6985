"""Smoke test of tools/bench_checkpoint.py: a tiny real run, every figure present and the background save's blocking
time a part of its call-to-commit time."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_checkpoint_tiny_run_reports_every_figure() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_checkpoint.py"), "--hidden", "64", "--layers",
                           "1", "--vocab", "500", "--rounds", "2", "--threads", "1"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    medians = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"\s+(.+?):\s+median\s+([\d.]+) ms\s+\[min ([\d.]+), max ([\d.]+)\]", line)
        if m:
            lo, med, hi = float(m.group(3)), float(m.group(2)), float(m.group(4))
            assert 0 < lo <= med <= hi, line
            medians[m.group(1).split(" (")[0]] = med  # "background save, blocking (staging copy)" -> before " ("
    assert len(medians) == 5, proc.stdout
    assert medians["background save, blocking"] <= medians["background save, call to commit"], medians
    ratio = float(re.search(r"blocking, background / synchronous \(medians\):\s+([\d.]+)", proc.stdout).group(1))
    assert ratio == pytest.approx(medians["background save, blocking"] / medians["synchronous save, blocking"],
                                  rel=0.05, abs=0.002)
