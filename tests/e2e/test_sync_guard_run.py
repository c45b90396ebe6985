"""The weight-sync guard (issue 37, item 4) on the real job entry point: a run whose engine misses one tensor at
every sync stops at its first step with the one-line reason (the exit record's, the rank's stderr, an event), and
the same run with nothing dropped completes. The broken engine is a stand-in (``tests/_fakes/dropping_sync.py``: the
real HF engine with one tensor left at vLLM's dummy values); the trainer, compile, run directory and exit record
are the real ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hpcppo import metrics as hmetrics
from hpcppo.rundir import events, exitcodes

from _harness import REPO, compile_run, free_port, logs_of, write_spec

STAND_IN = REPO / "tests" / "_fakes" / "dropping_sync.py"
DROP = "model.layers.0.mlp.down_proj.weight"
ONE_RANK = ["resources.procs_per_node=1", "trainer.total_steps=2", "trainer.val_before_train=false"]


def run_with(run_dir: Path, drop: str, world: int = 1) -> list[subprocess.CompletedProcess]:
    """The job entry point with the stand-in engine, once per rank (as the launchers start it); each rank's result."""
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), HPCPPO_ATTEMPT="a0", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(STAND_IN), drop, str(run_dir)], env=env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


def test_a_sync_that_drops_a_tensor_stops_the_run_in_one_line_and_a_healthy_one_does_not(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    # two ranks (the local default): both see the same gap of the gathered batch and stop together, none hangs
    broken = compile_run(spec, tmp_path / "runs", ["trainer.total_steps=2", "trainer.val_before_train=false"])
    ranks = run_with(broken, DROP, world=2)
    assert [r.returncode for r in ranks] == [exitcodes.FAILED] * 2, [r.stdout[-2000:] + r.stderr[-2000:] for r in ranks]
    assert all(f"dropped {DROP}" in r.stdout for r in ranks)  # the stand-in did break each rank's sync
    reason = exitcodes.read_exit_reason(broken, "a0")
    assert reason is not None and "\n" not in reason
    assert reason.startswith("the rollout engine (hf) and the trainer disagree after the weight sync of step 1: ")
    assert "above 0.001 (the default for a float32 engine, float32 trainer)" in reason
    for r in ranks:
        assert "Traceback" not in r.stderr
        assert [line for line in r.stderr.splitlines() if line.startswith("hpcppo: error:")] == \
            [f"hpcppo: error: {reason}"]
    stops = [e for e in events.read_events(broken) if e["kind"] == events.SYNC_MISMATCH]
    assert len(stops) == 1 and stops[0]["step"] == 1 and stops[0]["gap"] > 0.01, stops
    assert not (broken / "checkpoints").exists() or not list((broken / "checkpoints").glob("step-*"))

    healthy = compile_run(spec, tmp_path / "runs", ONE_RANK + [
                                                   "checkpoint.save_every=-1"])
    done = run_with(healthy, "")[0]
    assert done.returncode == exitcodes.DONE, logs_of(healthy) + done.stdout[-3000:] + done.stderr[-3000:]
    gaps = hmetrics.load(healthy)["rollout/logprob_gap"]
    assert len(gaps) == 2 and (gaps < 1e-5).all(), gaps.tolist()  # fp32 engine, fp32 trainer: rounding only
