"""The control inbox: request files, arrival order, bad files moved aside, acknowledgements, concurrency."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcppo.rundir import control
from hpcppo.rundir.control import Request, RequestError, acknowledge, pending, submit_request

REPO = Path(__file__).resolve().parents[2]
NAME_RE = r"^\d{8}T\d{6}\.\d{6}-\d+-[0-9a-f]{4}\.json$"


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    return path


def inbox(run: Path) -> Path:
    return run / "control" / "requests"


def test_a_request_is_one_json_file_named_by_time_pid_and_hex(run):
    req = submit_request(run, "rollback", to_step=20, lr_scale=0.25)
    [path] = inbox(run).iterdir()
    assert path == req.path and path.name == f"{req.id}.json"
    assert re.match(NAME_RE, path.name)
    data = json.loads(path.read_text())
    assert data == {"id": req.id, "action": "rollback", "to_step": 20, "lr_scale": 0.25, "created": req.created,
                    "requested_by": req.requested_by}
    assert data["created"].endswith("+00:00")
    assert f"pid {os.getpid()}" in data["requested_by"] and "@" in data["requested_by"]
    assert pending(run) == [req]


def test_defaults_are_null_in_the_file(run):
    req = submit_request(run, "rollback")
    assert (req.to_step, req.lr_scale) == (None, None)
    assert json.loads(req.path.read_text())["lr_scale"] is None
    assert control.DEFAULT_LR_SCALE == 0.5


@pytest.mark.parametrize(("action", "params", "message"), [
    ("pause", {}, "unknown control action 'pause'; known actions: rollback"),
    ("rollback", {"step": 3}, "unknown parameter(s) step for 'rollback'; it takes to_step, lr_scale"),
    ("rollback", {"to_step": -1}, "to_step must be an integer >= 0, got -1"),
    ("rollback", {"to_step": 2.0}, "to_step must be an integer >= 0, got 2.0"),
    ("rollback", {"to_step": True}, "to_step must be an integer >= 0, got True"),
    ("rollback", {"lr_scale": 0}, "lr_scale must be a number in (0, 1] (the learning rates are multiplied by it), got 0"),
    ("rollback", {"lr_scale": 1.5}, "got 1.5"),
    ("rollback", {"lr_scale": float("nan")}, "got nan"),
    ("rollback", {"lr_scale": "0.5"}, "got '0.5'"),
])  # fmt: skip
def test_invalid_requests_are_refused_and_nothing_is_written(run, action, params, message):
    with pytest.raises(RequestError) as exc:
        submit_request(run, action, **params)
    assert message in str(exc.value)
    assert exc.value.exit_code == 2
    assert not (run / "control").exists()


def test_lr_scale_one_is_allowed_and_an_int_becomes_a_float(run):
    req = submit_request(run, "rollback", lr_scale=1)
    assert req.lr_scale == 1.0 and isinstance(req.lr_scale, float)


def test_no_inbox_is_created_outside_a_run(tmp_path):
    with pytest.raises(FileNotFoundError):
        submit_request(tmp_path / "missing", "rollback")
    assert not (tmp_path / "missing").exists()


def test_pending_is_in_arrival_order_and_ignores_temporary_files(run):
    reqs = [submit_request(run, "rollback", to_step=i) for i in range(5)]
    (inbox(run) / ".20990101T000000.000000-1-abcd.json.x1.tmp").write_text("{half")  # a write in flight
    (inbox(run) / "subdir").mkdir()
    assert [r.to_step for r in pending(run)] == [0, 1, 2, 3, 4]
    assert pending(run) == reqs
    assert not (run / "control" / "rejected").exists()


def test_pending_without_an_inbox_is_empty(run):
    assert pending(run) == []


def _drop(run: Path, name: str, content: str | bytes) -> Path:
    inbox(run).mkdir(parents=True, exist_ok=True)
    path = inbox(run) / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


GOOD = "20250102T030405.000006-77-beef"


def _content(**changes) -> str:
    data = {"id": GOOD, "action": "rollback", "to_step": None, "lr_scale": None, "created": "2025-01-02T03:04:05+00:00",
            "requested_by": "me@host pid 77"} | changes
    return json.dumps({k: v for k, v in data.items() if v != "<drop>"})


@pytest.mark.parametrize(("name", "content", "reason"), [
    (f"{GOOD}.json", "{not json", "not JSON"),
    (f"{GOOD}.json", b"\xff\xfe", "not JSON"),
    (f"{GOOD}.json", "[1, 2]", "expected a JSON object, got list"),
    (f"{GOOD}.json", _content(action="explode"), "unknown control action 'explode'"),
    (f"{GOOD}.json", _content(lr_scale=2.0), "lr_scale must be a number in (0, 1]"),
    (f"{GOOD}.json", _content(to_step=-3), "to_step must be an integer >= 0, got -3"),
    (f"{GOOD}.json", _content(id="20250102T030405.000006-77-dead"), "does not match the file name"),
    (f"{GOOD}.json", _content(extra=1), "unknown key(s) extra"),
    (f"{GOOD}.json", _content(created="<drop>"), "missing key(s) created"),
    ("notes.txt", "hello", "the file name is not"),
])  # fmt: skip
def test_a_bad_file_is_moved_to_rejected_with_its_reason(run, name, content, reason):
    good = submit_request(run, "rollback", to_step=1)
    bad = _drop(run, name, content)
    original = bad.read_bytes()
    assert pending(run) == [good]  # never raises, the good one still comes through
    assert not bad.exists()
    rejected = run / "control" / "rejected"
    assert (rejected / name).read_bytes() == original
    assert reason in (rejected / f"{name}.reason").read_text()
    assert pending(run) == [good]  # and it is not seen again


def test_a_well_formed_foreign_request_is_read(run):
    _drop(run, f"{GOOD}.json", _content(to_step=7, lr_scale=0.1))
    [req] = pending(run)
    assert (req.id, req.to_step, req.lr_scale, req.requested_by) == (GOOD, 7, 0.1, "me@host pid 77")


def test_acknowledge_records_the_outcome_and_removes_the_request(run):
    req = submit_request(run, "rollback", to_step=20)
    outcome = {"status": "applied", "checkpoint": 20, "step": 23}
    acknowledge(run, req, outcome)
    assert pending(run) == [] and not req.path.exists()
    ack = json.loads((run / "control" / "done" / req.name).read_text())
    assert ack["outcome"] == outcome and ack["id"] == req.id and ack["to_step"] == 20 and ack["acked"]
    assert control.done(run, req.id) == ack
    # idempotent: the first outcome stays
    acknowledge(run, req, {"status": "rejected", "reason": "late"})
    assert control.done(run, req.id) == ack


def test_acknowledge_after_a_crash_between_write_and_unlink(run):
    req = submit_request(run, "rollback")
    acknowledge(run, req, {"status": "applied"})
    req.path.write_text(json.dumps(req.to_dict()))  # as if the unlink never happened
    acknowledge(run, req, {"status": "applied", "again": True})
    assert pending(run) == [] and control.done(run, req.id)["outcome"] == {"status": "applied"}


def test_withdraw_and_wait_for_ack(run):
    req = submit_request(run, "rollback")
    assert control.wait_for_ack(run, req, timeout_s=0.05, poll_s=0.01) is None
    assert control.withdraw(run, req) is True and control.withdraw(run, req) is False
    assert pending(run) == []
    other = submit_request(run, "rollback")
    acknowledge(run, other, {"status": "rejected", "reason": "no checkpoint"})
    assert control.wait_for_ack(run, other, timeout_s=0)["outcome"]["reason"] == "no checkpoint"


def test_request_is_frozen(run):
    req = submit_request(run, "rollback")
    with pytest.raises(AttributeError):
        req.to_step = 3  # type: ignore[misc]
    assert isinstance(req, Request)


WRITER = """
import sys
from hpcppo.rundir.control import submit_request
for i in range(int(sys.argv[2])):
    submit_request(sys.argv[1], "rollback", to_step=i, lr_scale=0.5)
"""


def test_concurrent_submissions_from_several_processes_make_distinct_parseable_files(run):
    procs, per = 6, 25
    children = [subprocess.Popen([sys.executable, "-c", WRITER, str(run), str(per)], cwd=REPO) for _ in range(procs)]
    assert [c.wait(timeout=120) for c in children] == [0] * procs
    files = sorted(p.name for p in inbox(run).iterdir())
    assert len(files) == len(set(files)) == procs * per
    reqs = pending(run)
    assert len(reqs) == procs * per and not (run / "control" / "rejected").exists()
    assert [r.name for r in reqs] == files  # arrival order is name order
    pids = {r.requested_by.rsplit(" ", 1)[1] for r in reqs}
    assert len(pids) == procs
    for pid in pids:  # each process's requests arrive in the order it wrote them
        assert [r.to_step for r in reqs if r.requested_by.endswith(f"pid {pid}")] == list(range(per))
