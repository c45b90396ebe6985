"""Real jobs on the 2-node dev cluster through ``hpcppo.launch.slurm``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpcppo.errors import SchedulerError
from hpcppo.launch import slurm

pytestmark = pytest.mark.slurm


def wait_for_file_lines(path: Path, n: int, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


def test_two_node_job_runs_one_task_per_node_and_sacct_reports_it(submit_job, tmp_path, wait_for_state):
    out = tmp_path / "ranks.out"
    job_id, submitted_at = submit_job(
        "#!/bin/bash\nsrun bash -c 'echo \"$SLURMD_NODENAME $SLURM_PROCID\"'\n",
        "-N2", "--ntasks-per-node=1", "-o", str(out),
    )  # fmt: skip
    info = wait_for_state(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, submitted_after=submitted_at)
    assert info.state == "COMPLETED", info
    assert sorted(out.read_text().split("\n")[:2]) == ["n1 0", "n2 1"]
    # Accounting lags the controller by moments (for ~0.2 s it even lists only the batch host, and on a busy machine
    # a COMPLETED record may come before its end time): then sacct is the source, with the whole record.
    info = wait_for_state(job_id, {"COMPLETED"}, 120, submitted_after=submitted_at,
                          condition=lambda i: i.source == "sacct" and i.nodelist == "n[1-2]"
                          and i.end_time is not None)  # fmt: skip
    assert (info.exit_code, info.restart_count) == ("0:0", 0)
    assert info.submit_time is not None and info.start_time is not None and info.end_time is not None
    assert info.submit_time <= info.start_time <= info.end_time
    assert slurm.expand_hostnames(info.nodelist) == ["n1", "n2"]


def test_cancel_running_job(submit_job, wait_for_state):
    job_id, submitted_at = submit_job("#!/bin/bash\nsleep 300\n", "-o", "/dev/null")
    running = wait_for_state(job_id, {"RUNNING"}, submitted_after=submitted_at)
    assert running.reason is None and running.nodelist in ("n1", "n2")
    slurm.cancel(job_id)
    info = wait_for_state(job_id, {"CANCELLED"}, 120, submitted_after=submitted_at)
    assert info.is_finished
    slurm.cancel(job_id)  # cancelling an ended job is not an error


def test_requeue_then_start_now_runs_the_job_again(submit_job, tmp_path, wait_for_state):
    runs = tmp_path / "runs.txt"
    job_id, submitted_at = submit_job(
        f'#!/bin/bash\necho "run ${{SLURM_RESTART_COUNT:-0}}" >> {runs}\nsleep 300\n', "-o", "/dev/null"
    )
    wait_for_state(job_id, {"RUNNING"}, submitted_after=submitted_at)
    assert wait_for_file_lines(runs, 1) == ["run 0"]
    slurm.requeue(job_id)
    # Requeued jobs wait ~2 minutes (BeginTime); the controller reports that while accounting lags.
    pending = wait_for_state(job_id, {"PENDING"}, 120, submitted_after=submitted_at, condition=lambda i: i.reason == "BeginTime")
    assert pending.restart_count == 1
    slurm.update_start_now(job_id)
    again = wait_for_state(job_id, {"RUNNING"}, 120, submitted_after=submitted_at)
    assert again.restart_count == 1
    assert wait_for_file_lines(runs, 2) == ["run 0", "run 1"]
    slurm.cancel(job_id)
    # Both records in accounting: the latest one wins and the older one counts as a restart.
    done = wait_for_state(job_id, {"CANCELLED"}, 120, submitted_after=submitted_at, condition=lambda i: i.source == "sacct")
    assert done.restart_count == 1


def test_batch_script_release_and_pending_reason(submit_job, tmp_path, wait_for_state):
    text = "#!/bin/bash\n# a comment with 'quotes' and $(not expanded)\necho hello\n"
    job_id, submitted_at = submit_job(text, "--hold", "-o", str(tmp_path / "held.out"))
    held = wait_for_state(job_id, {"PENDING"}, submitted_after=submitted_at, condition=lambda i: i.reason == "JobHeldUser")
    assert held.start_time is None
    assert slurm.batch_script(job_id) == text
    slurm.release(job_id)
    wait_for_state(job_id, {"COMPLETED"}, submitted_after=submitted_at)
    assert (tmp_path / "held.out").read_text() == "hello\n"


def test_without_accounting_query_falls_back_to_the_controller(slurm_cluster, submit_job, wait_for_state):
    done_id, done_at = submit_job("#!/bin/bash\nexit 3\n", "-o", "/dev/null")
    wait_for_state(done_id, {"FAILED"}, submitted_after=done_at)
    waiting_id, waiting_at = submit_job("#!/bin/bash\ntrue\n", "--begin=now+1hour", "-o", "/dev/null")
    wait_for_state(waiting_id, {"PENDING"}, submitted_after=waiting_at)
    after = {done_id: done_at, waiting_id: waiting_at}
    slurm_cluster.run("accounting-off")
    try:
        with pytest.raises(SchedulerError, match="sacct"):
            slurm._sacct([waiting_id], None, 10)  # accounting really is off
        infos = slurm.query_jobs([done_id, waiting_id], submitted_after=after)
    finally:
        slurm_cluster.run("accounting-on")
    assert (infos[waiting_id].state, infos[waiting_id].reason, infos[waiting_id].source) == ("PENDING", "BeginTime", "squeue")
    # A finished job still in the controller's memory: state and exit code from scontrol.
    assert (infos[done_id].state, infos[done_id].exit_code, infos[done_id].source) == ("FAILED", "3:0", "scontrol")


def test_sbatch_rejection_carries_slurms_message(slurm_cluster, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    with pytest.raises(SchedulerError, match="Invalid partition name specified"):
        slurm.submit_script(script, ["-p", "no-such-partition", "-o", "/dev/null"])


def test_unknown_job_id_is_unknown_not_an_error(slurm_cluster):
    info = slurm.query_jobs(["987654321"])["987654321"]
    assert (info.state, info.source) == ("UNKNOWN", "none")
    with pytest.raises(SchedulerError, match="could not read the batch script of job 987654321"):
        slurm.batch_script("987654321")


def test_missing_sbatch_on_path(slurm_cluster, tmp_path, monkeypatch):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(SchedulerError, match=r"sbatch not found on PATH; is this a Slurm login node\?"):
        slurm.submit_script(script)
    with pytest.raises(SchedulerError, match="sacct not found on PATH.*squeue not found on PATH"):
        slurm.query_jobs(["1"])
