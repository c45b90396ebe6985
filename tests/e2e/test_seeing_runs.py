"""Seeing a real local run (issue 8): ``submit --follow`` shows it live and keeps ``--wait``'s summary; a Ctrl-C
in its terminal detaches and the job goes on; ``follow``, ``logs``, ``runs`` and ``plot`` on the run it made.

The local executor's job (submitit's controller, its rank processes) is started by ``hpcppo submit``; a Ctrl-C
typed in a terminal is a SIGINT to the terminal's whole foreground process group. The detach test sends it the
same way: to the process group of a ``submit --follow`` started in a session of its own, as a shell would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from hpcppo.analysis import plot
from hpcppo.analysis.targets import Target
from hpcppo.cli import main
from hpcppo.launch import status
from hpcppo.rundir import RunDir

from _harness import REPO, write_spec

KL_SPEC = """
[algorithm]
use_kl_in_reward = true
"""
# A KL spike at step 5 makes the kl_rollback rule go back to checkpoint 4 (as in test_watchdog.py).
OVERRIDES = ["actor.lr=2e-5", "trainer.total_steps=8", "checkpoint.save_every=2", "debug.inject.kl_spike_at_step=5"]


def submit_follow(spec, runs) -> subprocess.Popen:
    argv = [sys.executable, "-m", "hpcppo.cli", "submit", str(spec), "--site", "local", "--follow", "-q",
            "--runs-root", str(runs)]
    for o in OVERRIDES:
        argv += ["-o", o]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True)


@pytest.mark.slow
def test_submit_follow_shows_the_run_live_then_the_summary(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny, extra=KL_SPEC)
    proc = submit_follow(spec, tmp_path / "runs")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out + err
    lines = out.splitlines()
    assert lines[0].startswith("submitted e2e-") and "  RUNNING" in lines
    steps = [line.split()[1] for line in lines if line.startswith("  step ")]
    assert steps[-1] == "8/8" and "5/8" in steps  # the spiked step 5 and the retried one
    assert any(line.startswith("  event at step 5: watchdog.rollback: kl_rollback") for line in lines)
    done = lines.index("  COMPLETED")
    assert lines[done + 1].startswith("8 steps, attempts")  # --wait's summary, after the live view
    assert any("watchdog.rollback" in line for line in lines[done + 1:])


@pytest.mark.slow
def test_ctrl_c_detaches_then_follow_logs_runs_and_plot(tmp_path, random_tiny, capsys):
    spec = write_spec(tmp_path / "exp.toml", random_tiny, extra=KL_SPEC)
    runs = tmp_path / "runs"
    proc = submit_follow(spec, runs)
    first = proc.stdout.readline()
    assert first.startswith("submitted "), first + proc.stderr.read()
    run_id = first.split()[1]
    while not (line := proc.stdout.readline()).startswith("  step "):
        assert line, proc.stderr.read()
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in its terminal
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and f"detached from {run_id}: the job goes on" in err, out + err
    run = RunDir.open(runs, run_id)
    assert status.run_status(run).state == "RUNNING"

    root = ["--runs-root", str(runs)]
    assert main(["follow", run_id, "--interval", "0.5", *root]) == 0  # back again, to the end
    text = capsys.readouterr().out
    assert "  step 8/8" in text and text.rstrip().endswith("  COMPLETED")
    assert "event at step 5: watchdog.rollback" in text

    assert main(["logs", run_id, "--rank", "1", "-n", "50", *root]) == 0
    assert "[rank 1]" in capsys.readouterr().out
    assert main(["logs", run_id, "-f", *root]) == 0  # the job ended: -f prints the log and returns
    assert "step 8/8" in capsys.readouterr().out

    assert main(["runs", "--json", *root]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["run_id"], row["state"], row["step"], row["total_steps"]) == (run_id, "COMPLETED", 8, 8)
    assert row["kl"] is not None and row["reward"] is not None

    out_png = tmp_path / "run.png"
    assert main(["plot", run_id, "-o", str(out_png), *root]) == 0 and out_png.stat().st_size > 10_000
    [series] = plot.load_series([Target(run_id, run.path, run.path)], ["kl/actor_ref"], "step")
    assert ("rollback", 5.0) in series.marks
    assert list(series.rows.loc[~series.rows["current"], "step"]) == [5]  # the spiked step, abandoned

