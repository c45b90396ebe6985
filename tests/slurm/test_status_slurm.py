"""Status on the 2-node dev cluster tells the truth (issue 13 item 2): a preemption signal checkpoints and the job is
requeued (PENDING, restarts 1), a cancel of it is CANCELLED and resumable; a 2-minute job that checkpoints before its
time limit and may not be requeued ends with the batch script's exit 0 (Slurm: COMPLETED) and is TIMEOUT, resumable
from its checkpoint, because status reads rank 0's exit record. Each test takes a minute or two."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from _harness import logs_of, rows_logged, write_spec  # noqa: E402

from hpcppo.errors import RunStateError  # noqa: E402
from hpcppo.launch import jobs, slurm  # noqa: E402
from hpcppo.launch.status import run_status  # noqa: E402

LONG = ["trainer.total_steps=10000", "checkpoint.save_every=0", "watchdog.enable=false"]



def test_preempted_job_is_requeued_then_cancelled_and_resumable(slurm_cluster, random_tiny, tmp_path, wait_until,
                                                                launched):
    spec = write_spec(tmp_path / "exp.toml", random_tiny, name="slurm-preempt-status")
    crun = jobs.compile_run(spec, "local-slurm", LONG, runs_root=str(tmp_path / "runs"))
    run = crun.run
    launched.append(run)
    job_id = jobs.submit_run(crun)
    wait_until(lambda: rows_logged(run.path) >= 2, 180, "two training steps", run.path)
    slurm.cancel(job_id, signal="USR2")  # what a preemption (or --signal=USR2@lead) sends to the job steps
    wait_until(lambda: run_status(run).state == "PENDING" and run_status(run).restarts == 1, 120,
               "the requeue", run.path)
    st = run_status(run)
    assert st.reason == "BeginTime" and st.exit_record is None  # restart 1 has not run yet
    assert (run.control / f"exit-code.{job_id}.0").read_text().strip() == "75"
    ckpt = st.latest_checkpoint
    assert ckpt is not None and ckpt >= 2
    jobs.cancel_run(run)
    wait_until(lambda: run_status(run).state == "CANCELLED", 60, "the cancel", run.path)
    st = run_status(run)
    assert st.resumable and st.reason.startswith("cancel requested at "), st
    assert st.reason.endswith(f"; resumable, checkpoint {ckpt}"), st


def test_a_checkpoint_before_the_time_limit_without_requeue_is_timeout(slurm_cluster, random_tiny, tmp_path,
                                                                        wait_until, launched):
    spec = write_spec(tmp_path / "exp.toml", random_tiny, name="slurm-timeout-status")
    crun = jobs.compile_run(spec, "local-slurm", [*LONG, 'resources.time="00:02:00"', "site.slurm.signal_lead_s=30",
                                                  "site.slurm.requeue=false"], runs_root=str(tmp_path / "runs"))
    run = crun.run
    launched.append(run)
    job_id = jobs.submit_run(crun)
    # USR2 30-90 s into the job (30 s before the limit, "up to 60 s earlier"); the trainers checkpoint and exit 75;
    # `scontrol requeue` is refused for a --no-requeue job and the batch script exits 0.
    wait_until(lambda: slurm.query_jobs([job_id])[job_id].is_finished, 150, "the end of the job", run.path)
    assert slurm.query_jobs([job_id])[job_id].state == "COMPLETED"  # what Slurm alone would report
    st = run_status(run)
    assert (st.state, st.exit_record, st.resumable) == ("TIMEOUT", 75, True), (st, logs_of(run.path))
    ckpt = st.latest_checkpoint
    where = f"checkpoint {ckpt}" if ckpt is not None else "no checkpoint yet: starts over"  # USR2 before step 1
    assert st.reason == f"time limit 00:02:00: checkpointed before it; resumable, {where}"
    assert run.read_record()["attempts"][-1]["state"] == "TIMEOUT"
    # and resume knows it is not done
    try:
        jobs.resume_run(run)
    except RunStateError as exc:  # pragma: no cover - a failure message worth seeing
        raise AssertionError(f"a TIMEOUT run must be resumable: {exc}") from None
    jobs.cancel_run(run)
