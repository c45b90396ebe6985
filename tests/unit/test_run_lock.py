"""One writer per run (issue 13 item 3): ``submit``, ``resume``, ``cancel`` and ``rollback`` hold the run
directory's lock (``RunDir.lock``, a ``link(2)``-created ``.lock`` file with its owner) from the status they
decide on to the attempt they record. Real concurrent processes race here; submission is replaced by a
recorder that starts a stand-in controller process, so the winner's job is RUNNING for the losers."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import multiprocessing
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.errors import PathError, RunBusyError, RunStateError
from hpcppo.launch import jobs, status, submit
from hpcppo.rundir import RunDir
from hpcppo.rundir import lock as run_lock
from hpcppo.rundir.lock import LOCK_STALE_S
from hpcppo.rundir.paths import LOCK

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"
DEAD_PID = "999999999"
FORK = multiprocessing.get_context("fork")


@pytest.fixture()
def stopped_run(tmp_path) -> RunDir:
    """A local run whose first attempt checkpointed and stopped (both ranks returned 75): resumable."""
    from submitit.core.utils import JobPaths

    crun = jobs.compile_run(ARITH, "local", [], runs_root=str(tmp_path / "runs"), check_paths=False)
    run = crun.run
    run.add_attempt(job_id=DEAD_PID, scheduler="local", state="RUNNING", kind="submit")
    for task in (0, 1):
        path = JobPaths(run.submitit, job_id=DEAD_PID, task_id=task).result_pickle
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(("success", 75)))
    assert status.run_status(run).state == "PREEMPTED"
    return run


@pytest.fixture()
def recorded_submissions(tmp_path, monkeypatch):
    """``submit.submit_local`` replaced: after a pause (so that racers overlap), start a process that looks like
    submitit's controller of this run (its pid is the job id), record the attempt and the call."""
    log = tmp_path / "submissions.log"
    started: list[int] = []

    def fake_submit_local(run: RunDir, ranks: int, minutes: float) -> str:
        time.sleep(0.3)
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "submitit",
                                 str(run.submitit)], start_new_session=True)
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {proc.pid}\n")
        run.add_attempt(job_id=str(proc.pid), scheduler="local", state="RUNNING", kind="resume")
        return str(proc.pid)

    monkeypatch.setattr(submit, "submit_local", fake_submit_local)
    yield log, started
    if log.exists():
        for line in log.read_text().split("\n"):
            if line:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(line.split()[1]), signal.SIGKILL)


def _racer(barrier, argv: list[str], out: str) -> None:
    err = io.StringIO()
    barrier.wait()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    Path(out).write_text(json.dumps({"rc": rc, "err": err.getvalue()}))


def race(tmp_path: Path, argvs: list[list[str]]) -> list[dict]:
    barrier = FORK.Barrier(len(argvs))
    procs = []
    for i, argv in enumerate(argvs):
        p = FORK.Process(target=_racer, args=(barrier, argv, str(tmp_path / f"racer-{i}.json")))
        p.start()
        procs.append(p)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0, p.exitcode
    return [json.loads((tmp_path / f"racer-{i}.json").read_text()) for i in range(len(argvs))]


def test_six_concurrent_resumes_start_exactly_one_job(stopped_run, recorded_submissions, tmp_path):
    log, _ = recorded_submissions
    runs = str(stopped_run.path.parent)
    results = race(tmp_path, [["resume", stopped_run.run_id, "--runs-root", runs]] * 6)
    winners = [r for r in results if r["rc"] == 0]
    assert len(winners) == 1, results
    [job] = [line.split()[1] for line in log.read_text().splitlines()]
    attempts = stopped_run.read_record()["attempts"]
    assert [a["job_id"] for a in attempts] == [DEAD_PID, job]
    for r in results:
        if r["rc"] == 0:
            continue
        lines = r["err"].strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r["err"], r
        busy = f"run {stopped_run.run_id} is being changed by `hpcppo resume`, pid "
        running = f"run {stopped_run.run_id} is RUNNING (job {job}); it can be resumed once it has stopped"
        assert (r["rc"], busy in lines[0]) == (RunBusyError.exit_code, True) or \
            (r["rc"], running in lines[0]) == (RunStateError.exit_code, True), r
    assert status.run_status(stopped_run).state == "RUNNING"
    assert not (stopped_run.path / LOCK).exists()
    assert sorted(p.name for p in stopped_run.path.glob(".lock*")) == []  # no private files left either


def test_resume_rollback_and_cancel_racing_leave_one_new_attempt(stopped_run, recorded_submissions, tmp_path):
    (stopped_run.checkpoints / "step-10").mkdir(parents=True)
    (stopped_run.checkpoints / "step-10" / "COMMITTED").write_text("{}\n")
    runs = str(stopped_run.path.parent)
    argvs = [[cmd, stopped_run.run_id, "--runs-root", runs] for cmd in ("resume", "rollback", "resume", "rollback")]
    results = race(tmp_path, argvs)
    attempts = stopped_run.read_record()["attempts"]
    assert len(attempts) == 2, (attempts, results)  # one job started, by whichever won
    assert sum(r["rc"] == 0 and cmd == "resume" for r, (cmd, *_) in zip(results, argvs)) <= 1


def _hold(run_path: str, ready, release) -> None:
    with RunDir(Path(run_path)).lock("resume"):
        ready.set()
        release.wait(30)


def test_while_one_command_holds_the_lock_the_others_say_who(stopped_run, recorded_submissions, capsys):
    ready, release = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_hold, args=(str(stopped_run.path), ready, release))
    holder.start()
    try:
        assert ready.wait(10)
        owner = json.loads((stopped_run.path / LOCK).read_text())
        assert (owner["action"], owner["pid"], owner["host"]) == ("resume", holder.pid, socket.gethostname())
        runs = str(stopped_run.path.parent)
        for command in ("resume", "cancel", "rollback"):
            capsys.readouterr()
            rc = main([command, stopped_run.run_id, "--runs-root", runs])
            err = capsys.readouterr().err
            if command == "rollback" and rc == RunStateError.exit_code:
                continue  # no checkpoint to go back to: refused before the lock
            assert rc == RunBusyError.exit_code, (command, err)
            assert err.strip() == (f"hpcppo: error: run {stopped_run.run_id} is being changed by `hpcppo resume`, pid "
                                   f"{holder.pid} on host {socket.gethostname()} since {owner['time']} (try again "
                                   f"when it is done; lock file {stopped_run.path / LOCK})")
    finally:
        release.set()
        holder.join(10)
    assert not (stopped_run.path / LOCK).exists()
    assert main(["resume", stopped_run.run_id, "--runs-root", str(stopped_run.path.parent)]) == 0


# ----------------------------------------------------------------------------- stale locks and file systems
def _write_lock(run: RunDir, *, host: str, pid: int, age_s: float = 0.0, text: str | None = None) -> Path:
    path = run.path / LOCK
    path.write_text(text if text is not None else json.dumps(
        {"action": "resume", "host": host, "pid": pid, "pid_start": None, "token": "f" * 16,
         "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}))
    if age_s:
        t = time.time() - age_s
        os.utime(path, (t, t))
    return path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_lock_left_by_a_dead_process_on_this_host_is_taken_over(stopped_run):
    _write_lock(stopped_run, host=socket.gethostname(), pid=_dead_pid())
    with stopped_run.lock("cancel"):
        assert json.loads((stopped_run.path / LOCK).read_text())["action"] == "cancel"
    assert not (stopped_run.path / LOCK).exists()


def test_a_reused_pid_does_not_keep_a_lock_alive(stopped_run):
    lock = _write_lock(stopped_run, host=socket.gethostname(), pid=os.getppid())
    owner = json.loads(lock.read_text())
    owner["pid_start"] = "1"  # the pid is alive, but it is another process than the one that locked
    lock.write_text(json.dumps(owner))
    with stopped_run.lock("cancel"):
        pass


def test_another_hosts_lock_is_respected_until_it_is_old(stopped_run):
    _write_lock(stopped_run, host="login-07.cluster", pid=os.getpid(), age_s=30)
    with pytest.raises(RunBusyError, match=r"being changed by `hpcppo resume`, pid \d+ on host login-07.cluster"):
        with stopped_run.lock("resume"):
            pass
    _write_lock(stopped_run, host="login-07.cluster", pid=os.getpid(), age_s=LOCK_STALE_S + 60)
    with stopped_run.lock("resume"):
        pass


def test_a_half_written_lock_is_busy_until_it_is_old(stopped_run):
    _write_lock(stopped_run, host="", pid=0, text="")
    with pytest.raises(RunBusyError, match="being changed by another command"):
        with stopped_run.lock("resume"):
            pass
    _write_lock(stopped_run, host="", pid=0, text="", age_s=LOCK_STALE_S + 60)
    with stopped_run.lock("resume"):
        pass


def test_without_hard_links_the_lock_is_an_exclusive_create(stopped_run, monkeypatch):
    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    with stopped_run.lock("resume"):
        assert json.loads((stopped_run.path / LOCK).read_text())["pid"] == os.getpid()
        with pytest.raises(RunBusyError):
            run_lock._acquire(stopped_run.path / LOCK, stopped_run.run_id, "cancel")  # another holder's attempt
    assert not (stopped_run.path / LOCK).exists()


def test_the_lock_is_reentrant_in_a_process_and_never_releases_anothers(stopped_run):
    with stopped_run.lock("rollback"):
        with stopped_run.lock("resume"):  # rollback_run resumes while holding it
            pass
        assert (stopped_run.path / LOCK).exists()
        # our lock was judged stale and broken by someone else, who locked again: our release leaves theirs
        _write_lock(stopped_run, host="elsewhere", pid=1)
    assert json.loads((stopped_run.path / LOCK).read_text())["host"] == "elsewhere"


def test_a_run_directory_we_cannot_write_is_a_one_line_error(stopped_run, monkeypatch):
    real_open = os.open

    def refuse(path, flags, mode=0o777, **kw):
        if str(path).startswith(str(stopped_run.path / LOCK)):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(PathError, match=f"cannot lock run {stopped_run.run_id}: .*Permission denied"):
        with stopped_run.lock("resume"):
            pass
