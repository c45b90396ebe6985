"""tools/bench_vllm.py runs end to end (the local default's workload only) and reports both engines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_vllm_reports_both_engines(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "bench_vllm.py"), "--skip-large", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = json.loads(out.read_text())
    for key in ("hf", "vllm"):
        assert result[key]["tokens_per_s"] > 0 and result[key]["tokens_per_round"] > 0
        assert result["startup_s"][key] > 0
    assert result["vllm"]["sync_s"] > 0 and result["bytes"] > 0
    assert "vLLM / HF generation tokens/s" in proc.stdout
