"""The process beside the trainer on the 2-node dev cluster, started by the batch script: the real trainer hangs
(``[debug.inject] hang_at_step``, the first attempt only) -> a ``hang`` event, exit record 75, the srun step cancelled,
the batch script requeues, and the next attempt resumes and finishes; a rank killed with SIGKILL -> the step
ends without an exit record and the monitor's last look records ``trainer_dead``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from _harness import write_spec  # noqa: E402

from hpcppo import metrics as hmetrics  # noqa: E402
from hpcppo.launch import jobs, slurm  # noqa: E402
from hpcppo.launch.status import run_status  # noqa: E402
from hpcppo.rundir import events  # noqa: E402
from hpcppo.rundir import RunDir  # noqa: E402

# The startup allowance (3 x min_heartbeat_s = 60 s) covers two ranks importing torch on the oversubscribed
# emulated nodes; after two rows the threshold is max(20 s, 3 x the median step time).
WATCHDOG = ["watchdog.min_heartbeat_s=20", "watchdog.heartbeat_factor=3", "watchdog.interval_s=2"]


def _state(job_id: str) -> str:
    return slurm.query_jobs([job_id])[job_id].state


def test_a_hung_job_is_detected_recorded_and_requeued(slurm_cluster, random_tiny, tmp_path, wait_until):
    spec = write_spec(tmp_path / "exp.toml", random_tiny, name="slurm-hang")
    crun = jobs.compile_run(spec, "local-slurm", ["trainer.total_steps=5", "checkpoint.save_every=2",
                                                  "debug.inject.hang_at_step=3", *WATCHDOG],
                            runs_root=str(tmp_path / "runs"))
    run = crun.run
    job_id = jobs.submit_run(crun)
    wait_until(lambda: events.read_events(run.path, kinds=["hang"]), 300, "the hang event", run.path)
    wait_until(lambda: _state(job_id) == "PENDING", 120, "the requeue", run.path)
    slurm.update_start_now(job_id)
    wait_until(lambda: _state(job_id) == "COMPLETED", 300, "the requeued attempt", run.path)

    (hang,) = events.read_events(run.path, kinds=["hang"])
    assert (hang["source"], hang["step"], hang["attempt"], hang["action"], hang["job_attempt"]) == (
        "monitor", 2, 0, "requeue", f"{job_id}.0")
    assert hang["seconds_since_row"] >= hang["threshold_s"] >= 20.0
    assert not events.read_events(run.path, kinds=["trainer_dead", "monitor.error"])
    assert (run.path / "control" / f"exit-code.{job_id}.0").read_text().strip() == "75"
    assert (run.path / "control" / f"exit-code.{job_id}.1").read_text().strip() == "0"
    first = (run.path / "logs" / f"attempt-{job_id}.0" / "watchdog.log").read_text()
    assert f"exit record 75 written; cancelled {job_id}.0" in first
    assert "exit record 0 of attempt" in (run.path / "logs" / f"attempt-{job_id}.1" / "watchdog.log").read_text()
    df = hmetrics.load(run.path)
    assert list(df["step"]) == [1, 2, 3, 4, 5], df[["step", "attempt"]]
    status = run_status(RunDir(run.path))
    assert status.state == "COMPLETED" and status.restarts == 1


def test_a_killed_rank_is_recorded_as_a_dead_trainer(slurm_cluster, random_tiny, tmp_path, wait_until):
    spec = write_spec(tmp_path / "exp.toml", random_tiny, name="slurm-dead")
    crun = jobs.compile_run(spec, "local-slurm", ["trainer.total_steps=4", "checkpoint.save_every=0",
                                                  "debug.inject.kill_rank_at_step=2", "debug.inject.kill_rank=1",
                                                  *WATCHDOG], runs_root=str(tmp_path / "runs"))
    run = crun.run
    job_id = jobs.submit_run(crun)
    wait_until(lambda: _state(job_id) in ("FAILED", "COMPLETED", "CANCELLED"), 300, "the job to end", run.path)
    assert _state(job_id) == "FAILED"
    assert not (run.path / "control" / f"exit-code.{job_id}.0").exists()
    (dead,) = events.read_events(run.path, kinds=["trainer_dead"])
    assert (dead["source"], dead["step"], dead["job_attempt"]) == ("monitor", 1, f"{job_id}.0"), dead
    assert not events.read_events(run.path, kinds=["hang"])


def test_status_says_when_the_monitor_of_a_running_attempt_is_not_alive(slurm_cluster, random_tiny, tmp_path,
                                                                        wait_until):
    """The monitor's heartbeat (rundir.heartbeat) read by status: alive while it runs; SIGKILLed, status says so once
    the heartbeat is stale (3 intervals + 15 s), while the job is still RUNNING (its trainer hangs at step 1 and the
    monitor, with its 10-minute allowance, is not the one to stop it)."""
    import json
    import os
    import signal

    spec = write_spec(tmp_path / "exp.toml", random_tiny, name="slurm-monitor-gone")
    crun = jobs.compile_run(spec, "local-slurm", ["trainer.total_steps=2", "checkpoint.save_every=0",
                                                  "debug.inject.hang_at_step=1", "watchdog.min_heartbeat_s=600",
                                                  "watchdog.interval_s=1"], runs_root=str(tmp_path / "runs"))
    run = crun.run
    job_id = jobs.submit_run(crun)
    try:
        beat = run.monitor_heartbeat(f"{job_id}.0")
        wait_until(beat.exists, 180, "the monitor's first heartbeat", run.path)
        st = run_status(RunDir(run.path))
        assert (st.state, st.monitor) == ("RUNNING", "alive"), st
        os.kill(json.loads(beat.read_text())["pid"], signal.SIGKILL)  # the emulated nodes are processes here
        wait_until(lambda: run_status(RunDir(run.path)).monitor != "alive", 60, "status to see it", run.path)
        st = run_status(RunDir(run.path))
        assert st.state == "RUNNING" and st.monitor.startswith("not alive (last heartbeat "), st
        assert f"logs/attempt-{job_id}.0/watchdog.log" in st.monitor
    finally:
        slurm.cancel(job_id)
