"""Status tells the truth (issue 13 item 2): the job's own exit record (``control/exit-code.<attempt>``) is read
with the scheduler's state, so a time-limit stop, a preemption, a pause or a failure is never COMPLETED; only a
run that ended with its steps done is.

``verdict`` is tested on literal records; ``run_status`` on run directories with stand-in Slurm commands
(``sacct``/``squeue`` print what a test wrote) and with literal submitit result files for the local executor.
The real local path is ``tests/e2e/test_status_timeout.py``; the real cluster ``tests/slurm/test_status_slurm.py``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pickle
import time
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.errors import RunRecordError, RunStateError
from hpcppo.launch import jobs, status, statustext, submit
from hpcppo.rundir import RunDir

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"
JOB = "4242"


# ----------------------------------------------------------------------------- literal records
@pytest.mark.parametrize(
    ("scheduler_state", "record", "kw", "state", "reason_part"),
    [
        # exit record 0 is done, whatever the scheduler saw during teardown
        ("COMPLETED", 0, {}, "COMPLETED", None),
        ("CANCELLED", 0, {}, "COMPLETED", None),
        ("TIMEOUT", 0, {}, "COMPLETED", None),
        ("UNKNOWN", 0, {}, "COMPLETED", None),
        # 75: checkpointed; the batch script exits 0 whether or not its requeue worked
        ("COMPLETED", 75, {}, "PREEMPTED", "not requeued"),
        ("COMPLETED", 75, {"at_time_limit": True, "time_limit": "01:00:00"}, "TIMEOUT", "time limit 01:00:00"),
        ("TIMEOUT", 75, {}, "TIMEOUT", "checkpointed before it"),
        ("PREEMPTED", 75, {}, "PREEMPTED", "checkpointed"),
        ("CANCELLED", 75, {}, "CANCELLED", "checkpointed on the way out"),
        # a node failure signals the tasks on the way down: the hardware is why, the checkpoint is a bonus
        ("NODE_FAIL", 75, {}, "NODE_FAIL", "a node of the job failed; checkpointed on the way out"),
        ("OUT_OF_MEMORY", 75, {}, "OUT_OF_MEMORY", "ran out of memory; checkpointed"),
        ("COMPLETED", 75, {"scheduler": "local"}, "PREEMPTED", "preemption signal"),
        ("COMPLETED", 75, {"scheduler": "local", "at_time_limit": True}, "TIMEOUT", "checkpointed before it"),
        ("COMPLETED", 75, {"scheduler": "local", "cancel_requested": "2026-01-01T00:00:00+00:00"}, "CANCELLED",
         "cancel requested at 2026-01-01T00:00:00+00:00"),
        # 76: paused on request
        ("COMPLETED", 76, {"paused_reason": "kl_pause: kl 0.2 > 0.1"}, "PAUSED", "kl_pause"),
        ("COMPLETED", 76, {}, "PAUSED", "paused on request"),
        ("UNKNOWN", None, {"paused_reason": "by the user"}, "PAUSED", "by the user"),
        # 1: failed; Slurm's more precise failure wins
        ("FAILED", 1, {}, "FAILED", "rank 0 recorded a failure"),
        ("COMPLETED", 1, {}, "FAILED", "rank 0 recorded a failure"),
        ("NODE_FAIL", 1, {}, "NODE_FAIL", "a node of the job failed"),
        ("OUT_OF_MEMORY", 1, {}, "OUT_OF_MEMORY", "the job ran out of memory"),
        ("FAILED", 137, {}, "FAILED", "exit record 137"),
        # no record: the scheduler's state, checked against the run
        ("COMPLETED", None, {}, "FAILED", "without rank 0's exit record"),
        ("COMPLETED", None, {"steps_done": True}, "COMPLETED", None),
        ("COMPLETED", None, {"kind": "preflight"}, "COMPLETED", None),
        ("TIMEOUT", None, {"time_limit": "00:01:00"}, "TIMEOUT", "time limit 00:01:00: killed at it"),
        ("PREEMPTED", None, {}, "PREEMPTED", None),
        ("NODE_FAIL", None, {}, "NODE_FAIL", "a node of the job failed"),
        ("FAILED", None, {}, "FAILED", None),
        ("CANCELLED", None, {}, "CANCELLED", None),
        ("FAILED", None, {"scheduler": "local", "at_time_limit": True}, "TIMEOUT", "stopped by the local executor"),
        ("FAILED", None, {"scheduler": "local", "at_time_limit": True, "cancel_requested": "t"}, "CANCELLED", "t"),
        ("FAILED", None, {"at_time_limit": True}, "FAILED", None),  # Slurm says TIMEOUT itself when it is one
    ],
)  # fmt: skip
def test_verdict_on_literal_records(scheduler_state, record, kw, state, reason_part):
    got_state, reason = status.verdict(scheduler_state, None, record, **kw)
    assert got_state == state, (got_state, reason)
    if reason_part is None:
        assert reason is None or state != "COMPLETED"
    else:
        assert reason_part in reason, reason


def test_only_a_run_with_its_steps_done_is_completed():
    """Every exit record but 0, with every final Slurm state: never COMPLETED unless the steps are done."""
    for sched in sorted(status.FINAL_STATES | {"UNKNOWN"}):
        for record in (None, 1, 75, 76, 137):
            for scheduler in ("slurm", "local"):
                state, _ = status.verdict(sched, None, record, scheduler=scheduler)
                assert state != "COMPLETED", (sched, record, scheduler)
        assert status.verdict(sched, None, 0)[0] == "COMPLETED"


# ----------------------------------------------------------------------------- Slurm runs (stand-in commands)
class FakeSlurm:
    def __init__(self, root: Path):
        self.dir = root
        root.mkdir()
        for name in ("sacct", "squeue", "scontrol", "sbatch"):
            script = root / name
            script.write_text(f'#!/bin/sh\n[ -f "{root}/{name}.out" ] && cat "{root}/{name}.out"\n'
                              f'exit "$(cat "{root}/{name}.rc" 2>/dev/null || echo 0)"\n')
            script.chmod(0o755)

    def answer(self, name: str, out: str = "", rc: int = 0) -> None:
        (self.dir / f"{name}.out").write_text(out)
        (self.dir / f"{name}.rc").write_text(str(rc))


def slurm_time(t: dt.datetime) -> str:
    return t.astimezone().replace(tzinfo=None).isoformat(timespec="seconds")


def sacct_rows(*rows: tuple[str, dt.datetime], elapsed: str = "00:01:05") -> str:
    return "".join(f"{JOB}|{state}|None|{slurm_time(t)}|{slurm_time(t)}|Unknown|{elapsed}|n[1-2]|0:0\n" for state, t in rows)


def squeue_line(state: str, reason: str, submit: dt.datetime, restarts: int) -> str:
    return f"{JOB}|{state}|{reason}|{slurm_time(submit)}|N/A|N/A|0:00||{restarts}|\n"


def commit(run: RunDir, *steps: int) -> None:
    for step in steps:
        (run.checkpoints / f"step-{step}").mkdir(parents=True)
        (run.checkpoints / f"step-{step}" / "COMMITTED").write_text("{}\n")


@pytest.fixture()
def slurm_run(tmp_path, monkeypatch):
    fake = FakeSlurm(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{fake.dir}:/usr/bin:/bin")
    runs = tmp_path / "runs"
    crun = jobs.compile_run(ARITH, "local-slurm", ["trainer.total_steps=30"], runs_root=str(runs), check_paths=False)
    run = crun.run
    submitted = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    run.add_attempt(job_id=JOB, scheduler="slurm", state="PENDING", kind="submit", submitted_at=submitted.isoformat())
    return fake, runs, run, submitted + dt.timedelta(seconds=1)


def record(run: RunDir, attempt: str, code: int) -> None:
    (run.control / f"exit-code.{attempt}").write_text(f"{code}\n")


def test_slurm_completed_batch_script_after_a_failed_requeue_is_preempted(slurm_run):
    fake, _, run, t = slurm_run
    fake.answer("sacct", sacct_rows(("COMPLETED", t)))
    commit(run, 10, 20)
    record(run, f"{JOB}.0", 75)
    st = status.run_status(run)
    assert (st.state, st.exit_record, st.resumable, st.latest_checkpoint) == ("PREEMPTED", 75, True, 20)
    assert st.reason.endswith("; resumable, checkpoint 20") and "not requeued" in st.reason
    assert statustext.state_text(st.state, st.reason).startswith("PREEMPTED (")
    assert run.read_record()["attempts"][-1]["state"] == "PREEMPTED"  # remembered, as a final state is


def test_slurm_timeout_without_a_checkpoint_says_it_starts_over(slurm_run):
    fake, _, run, t = slurm_run
    fake.answer("sacct", sacct_rows(("TIMEOUT", t), elapsed="00:30:04"))
    st = status.run_status(run)
    assert (st.state, st.exit_record, st.resumable) == ("TIMEOUT", None, True)
    assert st.reason == "time limit 00:30:00: killed at it; resumable, no checkpoint yet: starts over"


def test_slurm_checkpoint_at_the_time_limit_not_requeued_is_timeout(slurm_run):
    fake, _, run, t = slurm_run
    # the job ran into its USR2 lead (local-slurm: 60 s before its 30 min), checkpointed, could not requeue
    fake.answer("sacct", sacct_rows(("COMPLETED", t), elapsed="00:29:10"))
    commit(run, 12)
    record(run, f"{JOB}.0", 75)
    st = status.run_status(run)
    assert st.state == "TIMEOUT" and st.reason == ("time limit 00:30:00: checkpointed before it; resumable, "
                                                         "checkpoint 12")


def test_slurm_requeued_job_shows_the_live_state(slurm_run):
    fake, _, run, t = slurm_run
    fake.answer("sacct", rc=1)  # accounting off: squeue answers
    fake.answer("squeue", squeue_line("PENDING", "BeginTime", t, restarts=1))
    record(run, f"{JOB}.0", 75)  # the first run checkpointed and requeued; the second has not run yet
    st = status.run_status(run)
    assert (st.state, st.reason, st.restarts, st.exit_record) == ("PENDING", "BeginTime", 1, None)


def test_slurm_reads_the_record_of_the_current_restart(slurm_run):
    fake, _, run, t = slurm_run
    fake.answer("sacct", sacct_rows(("REQUEUED", t), ("COMPLETED", t + dt.timedelta(seconds=150))))
    commit(run, 30)
    record(run, f"{JOB}.0", 75)
    record(run, f"{JOB}.1", 0)
    st = status.run_status(run)
    assert (st.state, st.restarts, st.exit_record, st.steps_done) == ("COMPLETED", 1, 0, True)


def test_slurm_node_fail_and_purged_job(slurm_run):
    fake, _, run, t = slurm_run
    fake.answer("sacct", sacct_rows(("NODE_FAIL", t)))
    commit(run, 10)
    st = status.run_status(run)
    assert (st.state, st.reason) == ("NODE_FAIL", "a node of the job failed; resumable, checkpoint 10")
    # the controller forgot the job and there is no accounting: run.json still knows
    fake.answer("sacct", "")
    fake.answer("squeue", "", rc=1)
    st = status.run_status(run)
    assert (st.state, st.source, st.resumable) == ("NODE_FAIL", "run.json", True)


def test_slurm_completed_without_record_before_the_last_step_is_failed(slurm_run):
    fake, _, run, t = slurm_run
    fake.answer("sacct", sacct_rows(("COMPLETED", t)))
    commit(run, 10)
    st = status.run_status(run)
    assert st.state == "FAILED" and "without rank 0's exit record" in st.reason
    commit(run, 30)  # all 30 steps are in a committed checkpoint: done
    assert status.run_status(run).state == "COMPLETED"


# ----------------------------------------------------------------------------- local runs (literal result files)
DEAD_PID = "999999999"  # a local job id is its controller's pid: this one is never alive


def write_result(run: RunDir, task: int, outcome: str, payload, mtime: float | None = None) -> None:
    from submitit.core.utils import JobPaths

    path = JobPaths(run.submitit, job_id=DEAD_PID, task_id=task).result_pickle
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps((outcome, payload)))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


@pytest.fixture()
def local_run(tmp_path):
    def make(*overrides: str, ran_s: float = 40.0) -> RunDir:
        crun = jobs.compile_run(ARITH, "local", list(overrides), runs_root=str(tmp_path / "runs"), check_paths=False)
        started = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=ran_s)
        crun.run.add_attempt(job_id=DEAD_PID, scheduler="local", state="RUNNING", kind="submit",
                             submitted_at=started.isoformat(timespec="seconds"))
        return crun.run

    return make


def test_local_time_limit_checkpoint_is_timeout_not_completed(local_run):
    """What `submit --site local -o resources.time=00:01:00 --wait` leaves: both ranks returned 75 through
    submitit ("success"), rank 0 wrote its record, 40 s after the start (USR2 comes 30 s before the limit)."""
    run = local_run("resources.time=\"00:01:00\"", "trainer.total_steps=400", ran_s=40)
    commit(run, 10, 19)
    for task in (0, 1):
        write_result(run, task, "success", 75)
    record(run, f"local-{DEAD_PID}", 75)
    st = status.run_status(run)
    assert (st.state, st.exit_record, st.resumable) == ("TIMEOUT", 75, True)
    assert st.reason == "time limit 00:01:00: checkpointed before it; resumable, checkpoint 19"
    # the rank's return value stands in for a missing record (same verdict)
    (run.control / f"exit-code.local-{DEAD_PID}").unlink()
    assert status.run_status(run).state == "TIMEOUT"


def test_local_preemption_signal_long_before_the_limit_is_preempted(local_run):
    run = local_run(ran_s=40)  # 30 min limit
    commit(run, 10)
    for task in (0, 1):
        write_result(run, task, "success", 75)
    st = status.run_status(run)
    assert (st.state, st.reason) == ("PREEMPTED", "checkpointed on a preemption signal; resumable, checkpoint 10")


def test_local_done_paused_and_killed_at_the_limit(local_run):
    run = local_run("resources.time=\"00:01:00\"", ran_s=61)
    for task in (0, 1):
        write_result(run, task, "error", "Traceback ...\nKeyboardInterrupt\n")
    assert status.run_status(run).state == "TIMEOUT"  # submitit killed the ranks at the limit, no checkpoint
    for task in (0, 1):
        write_result(run, task, "success", 76)
    assert status.run_status(run).state == "PAUSED"
    for task in (0, 1):
        write_result(run, task, "success", 0)
    st = status.run_status(run)
    assert (st.state, st.resumable, st.reason) == ("COMPLETED", False, None)


def test_a_killed_rank_1_is_reported_as_rank_1(local_run):
    """Rank 1 SIGKILLed: rank 0's collectives fail a moment later and its wrapper reports "exited with 1"."""
    run = local_run()
    now = time.time()
    write_result(run, 0, "error", "Traceback ...\nRuntimeError: rank 0 exited with 1; see rank-0.log\n", now - 5)
    write_result(run, 1, "error", "Traceback ...\nRuntimeError: rank 1 was ended by SIGKILL; see rank-1.log\n", now)
    st = status.run_status(run)
    assert st.state == "FAILED"
    assert st.reason == ("rank 1: RuntimeError: rank 1 was ended by SIGKILL; see rank-1.log "
                            "(1 other rank(s) failed after it)")
    # without a signal, the rank that failed first
    write_result(run, 1, "error", "Traceback ...\nValueError: bad batch\n", now - 9)
    assert status.run_status(run).reason.startswith("rank 1: ValueError: bad batch")


# ----------------------------------------------------------------------------- run.json that is not JSON
def test_an_unreadable_run_json_is_listed_as_such_and_the_others_still_are(local_run, capsys):
    good, bad = local_run(), local_run()
    for task in (0, 1):
        write_result(good, task, "success", 0)
    commit(good, 30)
    bad.run_json.write_text("{not json")
    rows = {st.run_id: st for st in status.statuses([good, bad])}
    assert rows[good.run_id].state == "COMPLETED"
    assert rows[bad.run_id].state == "UNREADABLE" and "run.json: not valid JSON" in rows[bad.run_id].reason
    runs = str(good.path.parent)
    assert main(["status", "--runs-root", runs, "--json"]) == 0
    listed = {st["run_id"]: st["state"] for st in json.loads(capsys.readouterr().out)}
    assert listed == {good.run_id: "COMPLETED", bad.run_id: "UNREADABLE"}
    commit(bad, 10)  # so that rollback gets as far as the record
    for command in ("status", "resume", "cancel", "rollback"):
        rc = main([command, bad.run_id, "--runs-root", runs])
        err = capsys.readouterr().err
        assert rc == RunStateError.exit_code and len(err.strip().splitlines()) == 1, (command, err)
        assert "Traceback" not in err and f"{bad.run_json}: not valid JSON" in err
    assert bad.run_json.read_text() == "{not json"  # never overwritten
    for text in ("[]", '{"attempts": {}}', '{"attempts": [{"state": "x"}]}'):
        bad.run_json.write_text(text)
        with pytest.raises(RunRecordError, match="not a run record"):
            bad.read_record()


# ----------------------------------------------------------------------------- resume of a finished run
def test_resume_of_a_run_with_all_steps_done_says_so_and_rollback_still_resubmits(local_run, capsys, monkeypatch):
    run = local_run("trainer.total_steps=30")
    commit(run, 20, 30)
    for task in (0, 1):
        write_result(run, task, "success", 0)
    submitted: list[str] = []

    def fake_submit(r, ranks, minutes):
        submitted.append(r.run_id)
        r.add_attempt(job_id=DEAD_PID, scheduler="local", state="RUNNING", kind="submit")
        return DEAD_PID

    monkeypatch.setattr(submit, "submit_local", fake_submit)
    runs = str(run.path.parent)
    rc = main(["resume", run.run_id, "--runs-root", runs])
    err = capsys.readouterr().err
    assert rc == RunStateError.exit_code and len(err.strip().splitlines()) == 1
    assert f"run {run.run_id} has done all its 30 steps (COMPLETED, checkpoint 30); there is nothing to resume" in err
    assert "hpcppo rollback" in err and submitted == []
    # steps done but no exit record (e.g. the record could not be written): the checkpoint says it all
    for task in (0, 1):
        write_result(run, task, "error", "RuntimeError: teardown")
    assert main(["resume", run.run_id, "--runs-root", runs]) == RunStateError.exit_code
    assert "has done all its 30 steps (FAILED, checkpoint 30)" in capsys.readouterr().err
    # a rollback writes its request first, then resumes: the request is work to do
    assert main(["rollback", run.run_id, "--to", "20", "--runs-root", runs]) == 0
    assert submitted == [run.run_id] and len(run.read_record()["attempts"]) == 2
    assert "resubmitted as job" in capsys.readouterr().out


# ----------------------------------------------------------------------------- a diagnosed failure's explanation (issue 25)
FULL = ("checkpoint step 6 could not be written under /scratch/r/checkpoints: no space left on that file system "
        "(0.1 MiB free when it failed, the last checkpoint took 3.2 MiB); checkpoint step 3 is intact and the run "
        "resumes from it (free space there (or lower checkpoint.keep_last), then hpcppo resume r)")


def test_the_exit_records_explanation_is_the_failed_runs_reason(local_run, capsys):
    """A full disk said only `FAILED (rank 1: RuntimeError: rank 1 exited with 1)`: rank 0 now writes the one-line
    explanation into its exit record, and status shows it."""
    from hpcppo.rundir import exitcodes

    run = local_run()
    now = time.time()
    write_result(run, 0, "error", "Traceback ...\nRuntimeError: rank 0 exited with 1; see rank-0.log\n", now)
    write_result(run, 1, "error", "Traceback ...\nRuntimeError: rank 1 exited with 1; see rank-1.log\n", now - 1)
    exitcodes.write_exit_record(run.path, f"local-{DEAD_PID}", exitcodes.FAILED, FULL)
    st = status.run_status(run)
    assert (st.state, st.exit_record, st.exit_reason, st.reason) == ("FAILED", 1, FULL, FULL)
    assert main(["status", run.run_id, "--runs-root", str(run.path.parent)]) == 0
    assert f"FAILED ({FULL})" in capsys.readouterr().out


def test_an_exit_record_is_the_code_then_one_line_and_old_records_still_read(tmp_path):
    from hpcppo.rundir import exitcodes

    exitcodes.write_exit_record(tmp_path, "7.0", exitcodes.FAILED, "disk full\nunder /x\t and more " + "y" * 5000)
    text = (tmp_path / "control" / "exit-code.7.0").read_text()
    first, second, rest = text.split("\n", 2)
    assert (first, rest) == ("1", "") and second.startswith("disk full under /x and more yyy") and len(second) == 2000
    assert exitcodes.read_exit_record(tmp_path, "7.0") == 1 and exitcodes.read_exit_reason(tmp_path, "7.0") == second
    (tmp_path / "control" / "exit-code.6.0").write_text("75\n")  # as every record was written before
    assert exitcodes.read_exit_record(tmp_path, "6.0") == 75 and exitcodes.read_exit_reason(tmp_path, "6.0") is None
    assert exitcodes.read_exit_record(tmp_path, "5.0") is None and exitcodes.read_exit_reason(tmp_path, "5.0") is None


def _batch_tail(tmp_path: Path) -> str:
    """The rendered Slurm script from the line after srun to its end: what the batch shell does with the record."""
    crun = jobs.compile_run(ARITH, "local-slurm", [], runs_root=str(tmp_path / "runs"), check_paths=False)
    text = crun.run.script.read_text()
    return text[text.index("rc=$?"):]


@pytest.mark.parametrize("record, shown, rc, requeued", [
    ("1\n" + FULL + "\n", "1", 1, False), ("75\n", "75", 0, True), ("75\ncheckpointed on a signal\n", "75", 0, True),
    ("76\n", "76", 0, False), ("0\n", "0", 0, False), ("0", "0", 0, False), ("garbage\n", "1", 1, False)])
def test_the_batch_script_reads_the_code_from_the_records_first_line(record, shown, rc, requeued, tmp_path):
    import subprocess

    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol.calls"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "exit-code.9.0").write_text(record)
    script = "false\n" + _batch_tail(tmp_path)  # srun's stand-in exits 1: the record decides
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HPCPPO_RUN_DIR": str(tmp_path), "HPCPPO_ATTEMPT": "9.0",
           "SLURM_JOB_ID": "9"}
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == rc and proc.stderr == "", proc.stdout + proc.stderr
    assert f"trainers exited with {shown} at" in proc.stdout
    assert calls.exists() == requeued and (not requeued or calls.read_text() == "requeue 9\n")
