"""Bad input to ``metrics summary``, ``metrics export`` and ``compare``: one line on stderr, a non-zero exit code,
no traceback -- a path that is not HDF5, a truncated file, an unknown metric, an empty run, a pending job."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.metrics import STANDARD_COLUMNS, MetricsWriter, load
from hpcppo.rundir import RunDir
from test_analysis_summary import compiled_run

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"
ROWS = 200


def hpcppo(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real command line in a fresh interpreter: what a user sees."""
    return subprocess.run([sys.executable, "-m", "hpcppo.cli", *argv], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env=env)  # fmt: skip


def one_line(proc: subprocess.CompletedProcess, code: int, text: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and text in lines[0], proc.stderr


@pytest.fixture(scope="module")
def log_file(tmp_path_factory) -> Path:
    """ROWS rows in chunks of 4: a cut in the middle keeps a prefix."""
    root = tmp_path_factory.mktemp("log")
    with MetricsWriter(root, STANDARD_COLUMNS, attempt=0, chunk_rows=4) as w:
        for step in range(1, ROWS + 1):
            w.log(step, {c: step + j / 100 for j, c in enumerate(STANDARD_COLUMNS)})
    return w.path


@pytest.mark.parametrize("command", [["metrics", "summary"], ["metrics", "export", "-o", "x.parquet"],
                                     ["compare", "SELF"]])
def test_a_file_that_is_not_hdf5(tmp_path, command):
    junk = tmp_path / "notes.h5"
    junk.write_text("just text\n")
    argv = [str(junk) if a == "SELF" else a for a in command]
    one_line(hpcppo(*argv[:2], str(junk), *argv[2:]), 5, f"{junk}: cannot open the metric log: not an HDF5 file")


def test_a_path_that_does_not_exist_and_a_run_id_that_names_no_run(tmp_path):
    one_line(hpcppo("metrics", "summary", str(tmp_path / "gone.h5")), 5, "gone.h5: no such run directory or metric file")
    one_line(hpcppo("metrics", "summary", "nope-20260101-000000-abcd", "--runs-root", str(tmp_path)), 6,
             "no run 'nope-20260101-000000-abcd'")


def test_a_truncated_file_shows_its_intact_rows_and_says_so_once(log_file, tmp_path):
    cut = tmp_path / "cut.h5"
    shutil.copy(log_file, cut)
    os.truncate(cut, log_file.stat().st_size // 2)
    kept = len(load(cut))
    assert 0 < kept < ROWS
    proc = hpcppo("metrics", "summary", str(cut))
    one_line(proc, 5, f"{cut}: damaged metric log: {kept} of its {ROWS} rows kept")
    assert f"{kept} rows" in proc.stdout
    proc = hpcppo("metrics", "export", str(cut), "-o", str(tmp_path / "cut.csv"))
    one_line(proc, 5, "shown: its intact rows")
    assert (tmp_path / "cut.csv").read_text().count("\n") == kept + 1

    os.truncate(cut, 10_000)  # nothing intact is left
    proc = hpcppo("metrics", "summary", str(cut))
    one_line(proc, 5, f"{cut}: damaged metric log: no row can be read (truncated: 10000 of its")
    assert proc.stdout == ""


def test_an_unknown_metric_suggests_close_names(log_file, capsys):
    assert main(["metrics", "summary", str(log_file), "-m", "actor/entopy"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "unknown metric column 'actor/entopy' (did you mean 'actor/entropy'" in err


def test_an_empty_run_and_an_empty_directory(tmp_path, capsys):
    run = compiled_run(tmp_path / "runs")
    RunDir(run).add_attempt(job_id="1", scheduler="local", state="RUNNING", kind="submit")
    capsys.readouterr()
    with MetricsWriter(run, ["reward/mean"], attempt=0):
        assert main(["metrics", "summary", str(run)]) == 8  # a file, still without a row
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run.name}: its metric log has no row yet; the job 1 is" in err
    (tmp_path / "nothing").mkdir()
    assert main(["metrics", "export", str(tmp_path / "nothing"), "-o", str(tmp_path / "n.csv")]) == 8
    assert capsys.readouterr().err == "hpcppo: error: nothing: has no metric file (attempt-NNNN.h5)\n"


def test_a_run_never_submitted(tmp_path, capsys):
    run = compiled_run(tmp_path / "runs")
    capsys.readouterr()
    assert main(["compare", str(run), str(run)]) == 8
    err = capsys.readouterr().err
    assert err == f"hpcppo: error: {run.name}: no metrics: the run has not been submitted (hpcppo submit, or hpcppo resume {run.name})\n"


SACCT_PENDING = "#!/bin/sh\necho \"4242|PENDING|Priority|$(date +%Y-%m-%dT%H:%M:%S)|Unknown|Unknown|00:00:00|None assigned|0:0\"\n"


def test_a_pending_job_in_one_line_and_the_other_runs_still_shown(tmp_path):
    runs = tmp_path / "runs"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sacct", SACCT_PENDING), ("squeue", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    assert main(["compile", str(ARITH), "--site", "local-slurm", "--no-check-paths", "-q", "--runs-root", str(runs)]) == 0
    [pending] = runs.iterdir()
    RunDir(pending).add_attempt(job_id="4242", scheduler="slurm", state="PENDING", kind="submit")
    proc = hpcppo("metrics", "summary", pending.name, "--runs-root", str(runs), env=env)
    one_line(proc, 8, f"{pending.name}: no metrics yet: the job 4242 is PENDING (Priority) (try again once it runs)")

    done = compiled_run(runs)
    with MetricsWriter(done, ["reward/mean"], attempt=0) as w:
        w.log(1, {"reward/mean": 0.5})
    proc = hpcppo("metrics", "summary", pending.name, done.name, "--runs-root", str(runs), env=env)
    one_line(proc, 8, "is PENDING")
    assert done.name in proc.stdout and "1 of 30 steps" in proc.stdout
