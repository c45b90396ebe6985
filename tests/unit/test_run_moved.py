"""A run directory copied or moved elsewhere (issue 25): its ``job.sbatch`` names the directory it was rendered for;
``resume`` renders it again for where the run is now, refuses a script that names none, and ``status`` says what a
copy not resumed yet is. The whole story on a real local job: ``tests/e2e/test_faults.py``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.launch import jobs, status
from hpcppo.launch.shell import script_run_dir
from hpcppo.rundir import RunDir

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"


@pytest.mark.parametrize("site", ["local", "local-slurm"])
@pytest.mark.parametrize("name", ["runs", "with space", "it's $(here)", "tab\there"])
def test_the_run_directory_a_rendered_script_names_reads_back(site, name, tmp_path):
    crun = jobs.compile_run(ARITH, site, [], runs_root=str(tmp_path / name), check_paths=False)
    assert script_run_dir(crun.run.script.read_text()) == str(crun.run.path)


def test_a_script_without_the_line_names_nothing():
    assert script_run_dir("#!/bin/bash\necho hi\n") is None
    assert script_run_dir("HPCPPO_RUN_DIR=/a /b\n") is None  # not one word
    assert script_run_dir("HPCPPO_RUN_DIR='/a\n") is None  # not closed


def copied(tmp_path: Path) -> tuple[RunDir, RunDir]:
    crun = jobs.compile_run(ARITH, "local", [], runs_root=str(tmp_path / "runs"), check_paths=False)
    crun.run.add_attempt(job_id="999999", scheduler="local", state="FAILED", kind="submit")  # ran once, long gone
    copy = tmp_path / "elsewhere" / crun.run.run_id
    shutil.copytree(crun.run.path, copy)
    return crun.run, RunDir(copy)


def test_status_of_a_copy_names_the_directory_its_script_runs_in(tmp_path, capsys):
    original, copy = copied(tmp_path)
    st = status.run_status(copy)
    assert st.moved_from == str(original.path) and f"a copy: job.sbatch runs in {original.path}" in st.reason
    assert status.run_status(original).moved_from is None
    assert main(["status", copy.run_id, "--runs-root", str(copy.path.parent)]) == 0
    assert f"copied from {original.path} (job.sbatch runs there" in capsys.readouterr().out


def test_the_script_is_rendered_again_for_the_copy_and_left_alone_at_home(tmp_path):
    from hpcppo.config import load_resolved

    original, copy = copied(tmp_path)
    text = original.script.read_text()
    assert jobs.script_for_here(original, load_resolved(original.resolved)) is None
    assert original.script.read_text() == text
    assert jobs.script_for_here(copy, load_resolved(copy.resolved)) == str(original.path)
    again = copy.script.read_text()
    assert script_run_dir(again) == str(copy.path) and str(original.path) not in again
    assert again == text.replace(str(original.path), str(copy.path))  # nothing else changed
    assert status.run_status(copy).moved_from is None


def test_resume_refuses_a_script_that_names_no_run_directory(tmp_path, capsys):
    original, copy = copied(tmp_path)
    copy.script.write_text("#!/bin/bash\nexec python -m hpcppo.train.main /somewhere\n")
    rc = main(["resume", copy.run_id, "--runs-root", str(copy.path.parent)])
    err = capsys.readouterr().err
    assert rc == 8 and len(err.strip().splitlines()) == 1, err
    assert "does not say which run directory it runs in" in err and len(copy.read_record()["attempts"]) == 1
