"""Smoke test of tools/bench_peers.py --quick: one real interleaved run of hpcppo's Trainer and the cleanrl-style loop
(and TRL when .venv-trl exists: an optional peer, announced when absent, never a failure)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HPCPPO_PHASES = ("generate", "reward", "old_logprob", "ref", "values", "critic_update", "actor_update")


@pytest.mark.slow
def test_bench_peers_quick_runs_interleaved_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_peers.py"), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text, r = proc.stdout, json.loads(out.read_text())
    has_trl = (ROOT / ".venv-trl" / "bin" / "python").exists()
    assert r["trl"] == has_trl
    if not has_trl:
        assert "TRL not installed: run tools/peers/setup_trl.sh" in text
    sides = ["hpcppo", "cleanrl"] + (["trl"] if has_trl else [])
    assert sorted(r["iterations_s"]) == sorted(sides)
    for side in sides:
        assert len(r["iterations_s"][side]) == 2  # --quick: 1 warm-up + 2 measured rounds, for every side
        assert all(0 < t < 60 for t in r["iterations_s"][side])
    for side in ("hpcppo", "cleanrl"):
        for phase in HPCPPO_PHASES:
            s = r["phases_s"][side][phase]
            assert 0 <= s["min"] <= s["median"] <= s["max"] < 60, (side, phase)
        # the phases fit inside the iteration they were measured in
        assert sum(r["phases_s"][side][p]["min"] for p in HPCPPO_PHASES) <= r["iteration_s"][side]["max"]
    ratio = r["ratios"]["hpcppo/cleanrl"]
    per_round = [a / b for a, b in zip(r["iterations_s"]["hpcppo"], r["iterations_s"]["cleanrl"])]
    assert ratio["min"] == pytest.approx(min(per_round)) and ratio["max"] == pytest.approx(max(per_round))
    # identical models: the same parameter counts on both sides (untied embeddings, vocab 64)
    assert r["params"]["hpcppo"] == r["params"]["cleanrl"]
    assert r["params"]["hpcppo"]["actor"] == 312448
    for section in ("seconds, median [min-max]", "ratios of iterations measured in the same round",
                    "FLOPs per iteration"):
        assert section in text, section
