"""``hpcppo logs`` (batch and rank logs, -n, -f) and ``hpcppo runs`` / ``status`` without a run (newest first,
progress from the metric log, filters, --json); each bad input is one line and a non-zero exit code."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from hpcppo.analysis import logs
from hpcppo.cli import main
from hpcppo.launch import jobs, status
from hpcppo.metrics import STANDARD_COLUMNS, MetricsWriter
from hpcppo.rundir import RunDir

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"


def new_run(runs: Path, name: str, site: str = "local", steps: int = 30):
    crun = jobs.compile_run(ARITH, site, [f"name={name}", f"trainer.total_steps={steps}"], runs_root=str(runs),
                            check_paths=False)
    return crun.run


def write_rows(run, last_step: int) -> None:
    with MetricsWriter(run.path, STANDARD_COLUMNS, attempt=0, swmr=False) as w:
        w.log(0, {"val/score": 0.25})
        for step in range(1, last_step + 1):
            w.log(step, {"reward/mean": step / 100, "kl/actor_ref": step / 1000, "kl/coef": 0.001})
        w.log(last_step + 1, {"val/score": 0.5})  # a validation-only row: the last reward is still found


@pytest.fixture(scope="module")
def made_runs(tmp_path_factory):
    """Three runs, a second apart (run ids carry the second they were made): built once, copied per test."""
    root = tmp_path_factory.mktemp("logs-runs") / "runs"
    local = new_run(root, "alpha")
    local.add_attempt(job_id="1745", scheduler="local", state="RUNNING", kind="submit")
    folder = local.logs / "attempt-local-1745"
    folder.mkdir(parents=True)
    for rank in (0, 1):
        (folder / f"rank-{rank}.log").write_text("".join(f"rank {rank} line {i}\n" for i in range(5)))
    write_rows(local, 12)
    time.sleep(1.1)
    slurm = new_run(root, "beta", site="local-slurm")
    slurm.add_attempt(job_id="4242", scheduler="slurm", state="PENDING", kind="submit")
    (slurm.logs / "slurm-4242.out").write_text("hpcppo: job 4242 attempt 4242.1\n")
    for attempt in ("4242.0", "4242.1"):
        (slurm.logs / f"attempt-{attempt}").mkdir(parents=True)
        (slurm.logs / f"attempt-{attempt}" / "rank-0.log").write_text(f"{attempt} rank 0\n")
    time.sleep(1.1)
    fresh = new_run(root, "gamma")  # compiled, never submitted
    return root, local.run_id, slurm.run_id, fresh.run_id


@pytest.fixture()
def runs(made_runs, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(made_runs[0], root)
    return root, *(RunDir.open(root, run_id) for run_id in made_runs[1:])


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch, tmp_path):
    """A Slurm that knows no job: sacct, squeue and scontrol stand-ins that fail."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sacct", "squeue", "scontrol"):
        (bin_dir / name).write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def one_line_error(capsys, argv) -> tuple[int, str]:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc != 0 and err.count("\n") == 1 and err.startswith("hpcppo: error: "), err
    return rc, err


# ----------------------------------------------------------------------------- logs
def test_logs_of_a_local_run_show_rank_0_and_say_so(runs, capsys):
    root, local, _, _ = runs
    assert main(["logs", local.run_id, "--runs-root", str(root)]) == 0
    out, err = capsys.readouterr()
    assert out == "".join(f"rank 0 line {i}\n" for i in range(5))
    assert "a local run's job script runs in each rank" in err and "rank-0.log" in err
    assert main(["logs", local.run_id, "--rank", "1", "-n", "2", "--runs-root", str(root)]) == 0
    assert capsys.readouterr().out == "rank 1 line 3\nrank 1 line 4\n"
    assert main(["logs", local.run_id, "--attempt", "1745", "-n", "1", "--runs-root", str(root)]) == 0
    assert capsys.readouterr().out == "rank 0 line 4\n"


def test_logs_of_a_slurm_run_show_the_batch_log_and_each_attempt(runs, capsys):
    root, _, slurm, _ = runs
    assert logs.log_attempts(slurm) == ["4242.0", "4242.1"]
    assert main(["logs", slurm.run_id, "--runs-root", str(root)]) == 0
    assert capsys.readouterr().out == "hpcppo: job 4242 attempt 4242.1\n"
    assert main(["logs", slurm.run_id, "--rank", "0", "--attempt", "4242.0", "--runs-root", str(root)]) == 0
    assert capsys.readouterr().out == "4242.0 rank 0\n"
    assert main(["logs", slurm.run_id, "--rank", "0", "--attempt", "attempt-4242.1", "--runs-root", str(root)]) == 0
    assert capsys.readouterr().out == "4242.1 rank 0\n"
    assert main(["logs", str(slurm.path), "--rank", "0", "--runs-root", str(root)]) == 0  # a run directory works too
    assert capsys.readouterr().out == "4242.1 rank 0\n"


def test_logs_bad_input_lists_what_exists(runs, capsys):
    root, local, slurm, fresh = runs
    rc, err = one_line_error(capsys, ["logs", local.run_id, "--rank", "7", "--runs-root", str(root)])
    assert "attempt local-1745 has no log of rank 7 (ranks: 0, 1)" in err
    rc, err = one_line_error(capsys, ["logs", slurm.run_id, "--attempt", "99", "--runs-root", str(root)])
    assert "no attempt '99' (attempts: 4242.0, 4242.1)" in err
    rc, err = one_line_error(capsys, ["logs", fresh.run_id, "--runs-root", str(root)])
    assert "no job log yet" in err
    rc, err = one_line_error(capsys, ["logs", "nope", "--runs-root", str(root)])
    assert "no run 'nope'" in err and rc == 6


def test_logs_follow_prints_what_is_appended_until_the_job_ends(runs, capsys, monkeypatch):
    root, local, _, _ = runs
    log = local.logs / "attempt-local-1745" / "rank-1.log"
    ended = threading.Event()
    monkeypatch.setattr(status, "run_status", lambda run: status.JobStatus(
        run_id=run.run_id, path=str(run.path), site="local", scheduler="local", attempts=1,
        state="COMPLETED" if ended.is_set() else "RUNNING"))
    monkeypatch.setattr(logs, "follow_file", _fast(logs.follow_file))

    def job():
        for i in range(5, 8):
            time.sleep(0.2)
            with open(log, "a") as f:
                f.write(f"rank 1 line {i}\n")
        ended.set()

    writer = threading.Thread(target=job)
    writer.start()
    assert main(["logs", local.run_id, "--rank", "1", "-f", "-n", "1", "--runs-root", str(root)]) == 0
    writer.join()
    assert capsys.readouterr().out == "".join(f"rank 1 line {i}\n" for i in range(4, 8))


def _fast(follow_file):
    def fast(*args, **kwargs):
        return follow_file(*args, **{**kwargs, "poll_s": 0.05})
    return fast


# ----------------------------------------------------------------------------- runs
def test_runs_newest_first_with_progress(runs, capsys):
    root, local, slurm, fresh = runs
    rows = logs.run_rows(root)
    assert [r["run_id"] for r in rows] == [fresh.run_id, slurm.run_id, local.run_id]
    alpha = rows[2]
    assert (alpha["step"], alpha["total_steps"], alpha["reward"], alpha["kl"], alpha["site"]) == (13, 30, 0.12, 0.012, "local")
    assert rows[0]["state"] == "NOT_SUBMITTED" and rows[0]["step"] is None
    assert rows[1]["state"] == status.run_status(slurm).state  # whatever the scheduler's absence means
    assert main(["runs", "--runs-root", str(root)]) == 0
    table = capsys.readouterr().out
    assert table.index(fresh.run_id) < table.index(slurm.run_id) < table.index(local.run_id)
    for cell in ("13/30", "0.12", "0.012", "local-slurm", "NOT_SUBMITTED", "newest first"):
        assert cell in table
    assert main(["status", "--runs-root", str(root)]) == 0  # status without a run is the same list
    listed = capsys.readouterr().out
    assert "newest first" in listed and listed.index(fresh.run_id) < listed.index(slurm.run_id) < listed.index(local.run_id)


def test_runs_filters_and_json(runs, capsys):
    root, local, slurm, fresh = runs
    assert main(["runs", "--json", "--name", "alph", "--runs-root", str(root)]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["run_id"] == local.run_id and row["step"] == 13 and row["reward"] == 0.12 and row["age_s"] >= 0
    assert main(["runs", "--json", "--name", "*-gamma-*", "--runs-root", str(root)]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == []
    assert main(["runs", "--json", "--name", "gamma-*", "--runs-root", str(root)]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == [fresh.run_id]
    assert main(["runs", "--json", "--state", "not_submitted", "--runs-root", str(root)]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == [fresh.run_id]
    assert main(["runs", "--state", "running,pending", "--name", "gamma", "--runs-root", str(root)]) == 0
    assert "match the filters" in capsys.readouterr().out


def test_runs_bad_input(runs, tmp_path, capsys):
    root, *_ = runs
    rc, err = one_line_error(capsys, ["runs", "--state", "RUNING", "--runs-root", str(root)])
    assert "unknown state 'RUNING' (did you mean RUNNING" in err
    assert main(["runs", "--runs-root", str(tmp_path / "none")]) == 0
    assert "no runs under" in capsys.readouterr().out


def test_a_run_with_an_unreadable_log_is_still_listed(runs, capsys):
    root, local, *_ = runs
    (local.metrics / "attempt-0000.h5").write_bytes(b"not an hdf5 file")
    rows = {r["run_id"]: r for r in logs.run_rows(root)}
    assert "attempt-0000.h5" in rows[local.run_id]["error"]  # what is wrong with it: the reader says
    assert main(["runs", "--runs-root", str(root)]) == 0
    assert "unreadable" in capsys.readouterr().out


def test_logs_watchdog_shows_the_monitors_log_of_an_attempt(runs, capsys):
    root, local, slurm, _ = runs
    (slurm.log_dir("4242.0") / "watchdog.log").write_text("monitor of 4242.0\n")
    (slurm.log_dir("4242.1") / "watchdog.log").write_text("monitor of 4242.1\nhang: no row for 700 s\n")
    assert main(["logs", slurm.run_id, "--watchdog", "--runs-root", str(root)]) == 0
    out, err = capsys.readouterr()
    assert out == "monitor of 4242.1\nhang: no row for 700 s\n" and "attempt-4242.1/watchdog.log" in err
    assert main(["logs", slurm.run_id, "--watchdog", "--attempt", "4242.0", "-n", "1", "--runs-root", str(root)]) == 0
    assert capsys.readouterr().out == "monitor of 4242.0\n"
    rc, err = one_line_error(capsys, ["logs", local.run_id, "--watchdog", "--runs-root", str(root)])
    assert "attempt local-1745 has no watchdog log" in err and "rank-0.log, rank-1.log" in err
    with pytest.raises(SystemExit):  # one log at a time
        main(["logs", slurm.run_id, "--watchdog", "--rank", "0", "--runs-root", str(root)])
    assert "argument --rank: not allowed with argument --watchdog" in capsys.readouterr().err
