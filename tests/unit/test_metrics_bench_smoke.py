"""tools/bench_metrics.py runs end to end on a small log (the 1,000,000-row figures are for a person to read)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_metrics_small(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "bench_metrics.py"), "--rows", "20000", "--runs", "3",
                           "--run-rows", "50", "--repeat", "1", "--no-plot", "--json", "--keep", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["columns"] == 45 and res["load_all_rows"] == 20000 and 19000 < res["load_rows"] < 20000
    for key in ("plain_read_s", "load_s", "load_all_s", "load_ratio", "summary_s", "export_parquet_s",
                "summary_100_s", "summary_100_cli_s"):
        assert res[key] > 0, key
    assert len(list((tmp_path / "many").iterdir())) == 3 and (tmp_path / "big.parquet").is_file()
