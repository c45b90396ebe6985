"""``hpcppo rollback``: a request in the control inbox for a running job, a new attempt for a stopped run,
and every user error as one line with nothing changed on disk.

The job's state is faked by replacing the status function; ``resume_run`` is replaced by a recorder, so
nothing is submitted. The trainer's side (applying the request) is not part of these tests.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.errors import RunIdError, RunStateError, SchedulerError
from hpcppo.launch import jobs
from hpcppo.rundir import control
from hpcppo.rundir import RunDir
from hpcppo.rundir.control import RequestError

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"


def make_checkpoints(run: Path, committed=(10, 20)) -> None:
    root = run / "checkpoints"
    for step in committed:
        (root / f"step-{step}").mkdir(parents=True)
        (root / f"step-{step}" / "COMMITTED").write_text("{}\n")
    (root / "step-30").mkdir(parents=True)  # renamed into place, never marked: not a checkpoint
    (root / "step-25.tmp-ab12").mkdir()  # being written


class Fake:
    """The run's state as the status function reports it, and the resume_run calls."""

    def __init__(self, monkeypatch, state: str = "RUNNING", job_id: str = "4242"):
        self.state, self.job_id = state, job_id
        self.resumed: list[RunDir] = []
        self.status_calls = 0
        self.resume_error: Exception | None = None

        import hpcppo.launch.status as status_module

        def run_status(run):
            self.status_calls += 1
            return status_module.JobStatus(run_id=run.run_id, path=str(run.path), site="local", scheduler="local",
                                           attempts=1, state=self.state, job_id=self.job_id)

        def resume_run(run):
            self.resumed.append(run)
            if self.resume_error is not None:
                raise self.resume_error
            return "99"

        # where the status function lives may move (launch.status); patch every name it is reached by
        for module in (jobs, status_module):
            monkeypatch.setattr(module, "run_status", run_status, raising=False)
        monkeypatch.setattr(jobs, "resume_run", resume_run)
        # rollback resubmits a stopped run on the status it decided on, under the lock it holds
        monkeypatch.setattr(jobs, "_resume_locked", lambda run, st: resume_run(run))


@pytest.fixture()
def env(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "runs"
    assert main(["compile", str(ARITH), "--site", "local", "--no-check-paths", "-q", "--runs-root", str(runs)]) == 0
    capsys.readouterr()
    [path] = runs.iterdir()
    make_checkpoints(path)
    return runs, path, Fake(monkeypatch)


def rollback(capsys, runs: Path, *argv: str) -> tuple[int, str, str]:
    rc = main(["rollback", *argv, "--runs-root", str(runs)])
    out, err = capsys.readouterr()
    return rc, out, err


def requests(run: Path) -> list[dict]:
    inbox = run / "control" / "requests"
    return [json.loads(p.read_text()) for p in sorted(inbox.iterdir())] if inbox.is_dir() else []


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under root, with the content of files (None for directories)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


# ----------------------------------------------------------------------------- a running job
def test_a_running_job_gets_a_request_for_its_next_step_boundary(env, capsys):
    runs, run, fake = env
    rc, out, err = rollback(capsys, runs, run.name)
    assert (rc, err) == (0, "")
    [req] = requests(run)
    assert (req["action"], req["to_step"], req["lr_scale"]) == ("rollback", None, None)
    path = run / "control" / "requests" / f"{req['id']}.json"
    assert out.splitlines() == [
        f"rollback of {run.name} requested: job 4242 (RUNNING) goes back to checkpoint step 20 (the newest committed, "
        f"as of now) with lr x0.5 (the default) at its next step boundary",
        f"  request: {path}",
        f"  follow it with: hpcppo status {run.name} --runs-root {runs}",
    ]  # fmt: skip
    assert fake.resumed == []
    assert [r.id for r in control.pending(run)] == [req["id"]]


def test_to_and_lr_scale_are_passed_as_given(env, capsys):
    runs, run, fake = env
    rc, out, _ = rollback(capsys, runs, run.name, "--to", "25", "--lr-scale", "0.25")
    assert rc == 0
    [req] = requests(run)
    assert (req["to_step"], req["lr_scale"]) == (25, 0.25)  # the trainer resolves the step when it applies it
    assert ("goes back to checkpoint step 20 (the newest committed at or before step 25, as of now) with lr x0.25 "
            "at its next step boundary") in out.splitlines()[0]


@pytest.mark.parametrize("state", ["PENDING", "REQUEUED", "CONFIGURING"])
def test_a_job_not_started_yet_reads_the_request_before_its_first_step(env, capsys, state):
    runs, run, fake = env
    fake.state = state
    rc, out, _ = rollback(capsys, runs, run.name, "--to", "10")
    assert rc == 0 and fake.resumed == [] and len(requests(run)) == 1
    assert f"job 4242 ({state}) goes back to checkpoint step 10" in out


def test_two_rollbacks_make_two_requests_in_order(env, capsys):
    runs, run, _ = env
    assert rollback(capsys, runs, run.name, "--to", "10")[0] == 0
    assert rollback(capsys, runs, run.name, "--to", "20")[0] == 0
    assert [r["to_step"] for r in requests(run)] == [10, 20]


# ----------------------------------------------------------------------------- a stopped run
@pytest.mark.parametrize("state", ["FAILED", "COMPLETED", "PAUSED", "PREEMPTED", "CANCELLED", "TIMEOUT", "UNKNOWN"])
def test_a_stopped_run_is_resubmitted_with_the_request_waiting(env, capsys, state):
    runs, run, fake = env
    fake.state = state
    rc, out, err = rollback(capsys, runs, run.name, "--to", "19", "--lr-scale", "0.1")
    assert (rc, err) == (0, "")
    assert [r.path for r in fake.resumed] == [run]
    [req] = requests(run)  # written before the new attempt starts: its trainer applies it before step 1
    assert (req["to_step"], req["lr_scale"]) == (19, 0.1)
    assert out.splitlines()[0] == (f"rollback of {run.name} (was {state}): resubmitted as job 99; it restarts from "
                                   f"checkpoint step 10 (the newest committed at or before step 19) with lr x0.1")


def test_a_failed_resubmission_withdraws_the_request(env, capsys):
    runs, run, fake = env
    fake.state = "FAILED"
    fake.resume_error = SchedulerError("sbatch: error: invalid partition")
    rc, out, err = rollback(capsys, runs, run.name)
    assert rc == SchedulerError.exit_code and out == ""
    assert err == "hpcppo: error: sbatch: error: invalid partition\n"
    assert requests(run) == [] and len(fake.resumed) == 1


# ----------------------------------------------------------------------------- --wait
def _ack_when_requested(run: Path, outcome: dict) -> threading.Thread:
    def trainer():
        for _ in range(500):
            found = control.pending(run)
            if found:
                control.acknowledge(run, found[0], outcome)
                return
            threading.Event().wait(0.01)

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    return thread


def _fast_polls(monkeypatch):
    wait = control.wait_for_ack
    monkeypatch.setattr(control, "wait_for_ack", lambda *a, **k: wait(*a, **{**k, "poll_s": 0.01}))


def test_wait_prints_the_acknowledgement(env, capsys, monkeypatch):
    runs, run, _ = env
    _fast_polls(monkeypatch)
    thread = _ack_when_requested(run, {"status": "applied", "checkpoint": 20, "step": 23})
    rc, out, _ = rollback(capsys, runs, run.name, "--wait", "--timeout", "5")
    thread.join()
    assert rc == 0
    last = out.splitlines()[-1]
    assert last.startswith("  applied at ") and last.endswith(": checkpoint 20, step 23")
    assert requests(run) == []


def test_wait_on_a_rejected_request_exits_non_zero(env, capsys, monkeypatch):
    runs, run, _ = env
    _fast_polls(monkeypatch)
    thread = _ack_when_requested(run, {"status": "rejected", "reason": "checkpoint 20 was pruned"})
    rc, out, _ = rollback(capsys, runs, run.name, "--wait", "--timeout", "5")
    thread.join()
    assert rc == 1 and out.splitlines()[-1].endswith(": reason checkpoint 20 was pruned")
    assert out.splitlines()[-1].startswith("  rejected at ")


def test_wait_times_out_and_leaves_the_request_queued(env, capsys, monkeypatch):
    runs, run, _ = env
    _fast_polls(monkeypatch)
    rc, out, err = rollback(capsys, runs, run.name, "--wait", "--timeout", "0.05")
    [req] = requests(run)
    assert rc == 1
    path = run / "control" / "requests" / f"{req['id']}.json"
    assert err == f"hpcppo: error: no acknowledgement within 0.05 s; the request stays queued: {path}\n"


# ----------------------------------------------------------------------------- errors: nothing changes
@pytest.mark.parametrize(("argv", "code", "message"), [
    (["--to", "5"], RunStateError.exit_code,
     "run {run} has no committed checkpoint at or before step 5; committed checkpoints: 10, 20"),
    (["--to", "-1"], RequestError.exit_code, "to_step must be an integer >= 0, got -1"),
    (["--lr-scale", "0"], RequestError.exit_code,
     "lr_scale must be a number in (0, 1] (the learning rates are multiplied by it), got 0.0"),
    (["--lr-scale", "1.5"], RequestError.exit_code,
     "lr_scale must be a number in (0, 1] (the learning rates are multiplied by it), got 1.5"),
    (["--lr-scale", "-0.5", "--to", "20"], RequestError.exit_code,
     "lr_scale must be a number in (0, 1] (the learning rates are multiplied by it), got -0.5"),
    (["--lr-scale", "nan"], RequestError.exit_code,
     "lr_scale must be a number in (0, 1] (the learning rates are multiplied by it), got nan"),
])  # fmt: skip
def test_bad_arguments_are_one_line_and_change_nothing(env, capsys, argv, code, message):
    runs, run, fake = env
    before = snapshot(runs)
    rc, out, err = rollback(capsys, runs, run.name, *argv)
    assert (rc, out) == (code, "")
    assert err == f"hpcppo: error: {message.format(run=run.name)}\n"
    assert snapshot(runs) == before
    assert fake.status_calls == 0 and fake.resumed == []  # validated before the scheduler is asked


def test_a_run_without_any_committed_checkpoint(env, capsys):
    runs, run, fake = env
    for step in (10, 20):
        (run / "checkpoints" / f"step-{step}" / "COMMITTED").unlink()
    before = snapshot(runs)
    rc, out, err = rollback(capsys, runs, run.name)
    assert (rc, out) == (RunStateError.exit_code, "")
    assert err == f"hpcppo: error: run {run.name} has no committed checkpoint; committed checkpoints: none\n"
    assert snapshot(runs) == before and fake.status_calls == 0


def test_an_unknown_run_lists_the_runs_there(env, capsys):
    runs, run, fake = env
    before = snapshot(runs)
    rc, out, err = rollback(capsys, runs, "arith-tiny-20250101-000000-abcd")
    assert (rc, out) == (RunIdError.exit_code, "")
    assert err == f"hpcppo: error: no run 'arith-tiny-20250101-000000-abcd' (runs under {runs}: {run.name})\n"
    assert snapshot(runs) == before and fake.status_calls == 0


@pytest.mark.parametrize("run_id", ["../" + "x", "a/b", "..", "x..y"])
def test_a_run_id_that_could_escape_the_runs_root(env, capsys, run_id):
    runs, _, fake = env
    before = snapshot(runs.parent)
    rc, out, err = rollback(capsys, runs, run_id)
    assert (rc, out) == (RunIdError.exit_code, "")
    [line] = err.splitlines()
    assert line.startswith(f"hpcppo: error: invalid run id {run_id!r} (run ids look like")
    assert snapshot(runs.parent) == before and fake.status_calls == 0
