"""Smoke test of tools/bench_token_budget.py: a tiny real run reports every path of both phases, and the token-budget
paths compute fewer tokens than the padded one on the same rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_token_budget_tiny_run_reports_every_path(tmp_path) -> None:
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_token_budget.py"), "--hidden", "64", "--layers",
                           "1", "--vocab", "256", "--rows", "6", "--rounds", "1", "--warmup", "0", "--threads", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert sorted(result["rounds"]) == sorted(f"{phase}/{path}" for phase in ("update", "logprob")
                                              for path in ("padded", "budget", "packed"))
    assert all(len(v) == 1 and v[0][0] > 0 for v in result["rounds"].values())
    tokens = result["computed_tokens"]
    assert tokens["packed"] == result["real_tokens"] < tokens["budget"] < tokens["padded"]
    assert "update   budget" in proc.stdout and "/ padded:" in proc.stdout
