"""The trainer on the 2-node dev cluster: a preemption signal checkpoints, the batch script requeues the
job, and the next attempt resumes from the checkpoint and finishes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from _harness import logs_of, rows_logged, write_spec  # noqa: E402

from hpcppo import metrics as hmetrics  # noqa: E402
from hpcppo.launch import jobs, slurm  # noqa: E402
from hpcppo.launch.status import run_status  # noqa: E402
from hpcppo.rundir import RunDir  # noqa: E402



def test_usr2_checkpoints_requeues_and_resumes(slurm_cluster, random_tiny, tmp_path, wait_until):
    spec = write_spec(tmp_path / "exp.toml", random_tiny, name="slurm-preempt")
    crun = jobs.compile_run(spec, "local-slurm", ["trainer.total_steps=14", "checkpoint.save_every=0"],
                            runs_root=str(tmp_path / "runs"))
    assert crun.compiled.plan.nodes == 2 and crun.compiled.plan.world_size == 2
    run = crun.run
    job_id = jobs.submit_run(crun)
    wait_until(lambda: rows_logged(run.path) >= 2, 180, "two training steps", run.path)
    slurm.cancel(job_id, signal="USR2")  # what Slurm's --signal=USR2@lead sends to the job steps
    # The trainers checkpoint and exit with the requeue code; the batch script requeues the job.
    wait_until(lambda: slurm.query_jobs([job_id])[job_id].state in ("PENDING", "REQUEUED"), 120, "the requeue",
               run.path)
    wait_until(lambda: slurm.query_jobs([job_id])[job_id].state == "PENDING", 60, "PENDING after requeue", run.path)
    first_ckpt = sorted(p.name for p in (run.path / "checkpoints").iterdir() if (p / "COMMITTED").exists())
    assert len(first_ckpt) == 1, first_ckpt
    slurm.update_start_now(job_id)
    wait_until(lambda: slurm.query_jobs([job_id])[job_id].state == "COMPLETED", 240, "the resumed attempt", run.path)

    df = hmetrics.load(run.path)
    assert list(df["step"]) == list(range(1, 15)), df[["step", "attempt"]]
    assert sorted(set(df["attempt"])) == [0, 1]
    assert (run.path / "checkpoints" / "step-14" / "COMMITTED").exists()
    assert (run.path / "logs" / f"attempt-{job_id}.0").is_dir() and (run.path / "logs" / f"attempt-{job_id}.1").is_dir()
    kinds = list(hmetrics.load_events(run.path)["kind"])
    assert "preempted" in kinds and "resume" in kinds
    status = run_status(RunDir(run.path))
    assert status.state == "COMPLETED" and status.restarts == 1
    # Both emulated nodes took part.
    ranks = "\n".join(p.read_text() for p in (run.path / "logs" / f"attempt-{job_id}.1").glob("rank-*.log"))
    assert "resumed from checkpoint" in ranks


def test_watchdog_restarts_a_nan_critic_pauses_on_kl_and_resume_finishes(slurm_cluster, random_tiny, tmp_path,
                                                                          wait_until):
    from hpcppo.rundir import events

    spec = write_spec(tmp_path / "exp.toml", random_tiny, name="slurm-watchdog", extra="""
[algorithm]
use_kl_in_reward = true
""")
    crun = jobs.compile_run(spec, "local-slurm", [
        "trainer.total_steps=6", "checkpoint.save_every=1", "actor.lr=2e-5",
        "debug.inject.nan_value_loss_at_step=2", "debug.inject.kl_spike_at_step=4", "debug.inject.kl_spike_value=0.2",
    ], runs_root=str(tmp_path / "runs"))
    run = crun.run
    job_id = jobs.submit_run(crun)
    wait_until(lambda: slurm.query_jobs([job_id])[job_id].state not in ("PENDING", "RUNNING", "CONFIGURING",
                                                                        "COMPLETING"),
               240, "the job to stop", run.path)
    # KL 0.2 > 0.1: the pause beats the rollback and the KL raise; no requeue, the run says why it stopped.
    status = run_status(RunDir(run.path))
    assert status.state == "PAUSED", (status, logs_of(run.path))
    assert "kl_pause" in (run.path / "control" / "PAUSED").read_text()
    kinds = [(e["kind"], e["step"]) for e in events.read_events(run.path)]
    assert ("watchdog.restart_critic", 2) in kinds and ("watchdog.pause", 4) in kinds
    assert ("watchdog.suppressed", 4) in kinds  # kl_rollback and kl_raise_coef matched too
    jobs.resume_run(RunDir(run.path))
    wait_until(lambda: run_status(RunDir(run.path)).state == "COMPLETED", 240, "the resumed attempt", run.path)
    df = hmetrics.load(run.path)
    assert list(df["step"]) == list(range(1, 7))
    assert df.set_index("step").loc[[3, 5, 6], "critic/vf_loss"].notna().all()
