from __future__ import annotations

import json
import re

import pytest

from hpcppo.errors import RunIdError
from hpcppo.fsutil import atomic_write_text
from hpcppo.rundir import RunDir, create_run_dir, new_run_id, validate_run_id


def test_new_run_id_format():
    run_id = new_run_id("arith-tiny")
    assert re.fullmatch(r"arith-tiny-\d{8}-\d{6}-[0-9a-f]{4}", run_id)


@pytest.mark.parametrize("bad", ["../etc", "a/b", "..", ".hidden", "-rf", "a\0b", "", "x" * 200, "a..b", "/abs"])
def test_invalid_run_ids_rejected(bad):
    with pytest.raises(RunIdError, match="invalid run id"):
        validate_run_id(bad)


def test_open_unknown_run_lists_known(tmp_path):
    with create_run_dir(tmp_path, "exp-20260101-000000-abcd") as d:
        (d / "resolved.toml").write_text("")
    with pytest.raises(RunIdError, match=r"no run 'nope'.*exp-20260101-000000-abcd"):
        RunDir.open(tmp_path, "nope")
    assert RunDir.open(tmp_path, "exp-20260101-000000-abcd").run_id == "exp-20260101-000000-abcd"


def test_create_run_dir_leaves_nothing_on_failure(tmp_path):
    with pytest.raises(RuntimeError):
        with create_run_dir(tmp_path, "exp-20260101-000000-abcd") as d:
            (d / "spec.toml").write_text("x")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_create_run_dir_layout_and_refuses_existing(tmp_path):
    with create_run_dir(tmp_path, "e-20260101-000000-0000") as d:
        (d / "resolved.toml").write_text("")
    final = tmp_path / "e-20260101-000000-0000"
    assert sorted(p.name for p in final.iterdir()) == ["checkpoints", "control", "logs", "metrics", "resolved.toml"]
    with pytest.raises(RunIdError, match="already exists"):
        with create_run_dir(tmp_path, "e-20260101-000000-0000"):
            pass


def test_attempts_are_appended(tmp_path):
    with create_run_dir(tmp_path, "e-20260101-000000-0000") as d:
        (d / "resolved.toml").write_text("")
    run = RunDir.open(tmp_path, "e-20260101-000000-0000")
    run.add_attempt(job_id="11", state="PENDING")
    run.add_attempt(job_id="12", state="PENDING")
    run.update_last_attempt(state="RUNNING")
    record = json.loads(run.run_json.read_text())
    assert [a["job_id"] for a in record["attempts"]] == ["11", "12"]
    assert record["attempts"][-1]["state"] == "RUNNING"
    assert all("submitted_at" in a for a in record["attempts"])


def test_atomic_write_leaves_no_temp_files(tmp_path):
    target = tmp_path / "f.txt"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_update_attempt_targets_the_job_id_not_the_last_attempt(tmp_path):
    with create_run_dir(tmp_path, "e-20260101-000000-0000") as d:
        (d / "resolved.toml").write_text("")
    run = RunDir.open(tmp_path, "e-20260101-000000-0000")
    run.add_attempt(job_id="11", state="PENDING")
    run.add_attempt(job_id="12", state="PENDING")  # added by another process after a reader saw job 11
    assert run.update_attempt("11", state="COMPLETED")
    assert [a["state"] for a in run.read_record()["attempts"]] == ["COMPLETED", "PENDING"]
    assert not run.update_attempt("99", state="FAILED")


def _add_attempts(path: str, worker: int, n: int) -> None:
    run = RunDir(path)
    for i in range(n):
        run.add_attempt(job_id=f"{worker}-{i}", state="PENDING")


def test_concurrent_writers_lose_no_attempt(tmp_path):
    """run.json is read-modify-written by the CLI, the job and the watchdog: the lock keeps every update."""
    import multiprocessing as mp

    with create_run_dir(tmp_path, "e-20260101-000000-0000") as d:
        (d / "resolved.toml").write_text("")
    path = str(tmp_path / "e-20260101-000000-0000")
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_add_attempts, args=(path, w, 25)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    ids = sorted(a["job_id"] for a in RunDir(path).read_record()["attempts"])
    assert ids == sorted(f"{w}-{i}" for w in range(4) for i in range(25))
