"""``hpcppo status`` and ``hpcppo cancel`` on real jobs of the dev cluster: a held job (with and without
accounting), a running job cancelled, and sbatch rejecting a job."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.errors import SchedulerError
from hpcppo.launch import status
from hpcppo.rundir import RunDir, list_runs

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
HOLD = 'site.slurm.extra_directives={hold = ""}'




def preflight(root: Path, capsys, *extra: str) -> RunDir:
    rc = main(["preflight", "--site", "local-slurm", "--nodes", "1", "--no-wait", "-q", "--runs-root", str(root), *extra])
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    [run] = [r for r in list_runs(root)]
    return run


def poll(run: RunDir, check, timeout_s: float = 60) -> status.JobStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        st = status.run_status(run)
        if check(st):
            return st
        if time.monotonic() > deadline:
            pytest.fail(f"{run.run_id}: status never satisfied the check; last {st}")
        time.sleep(0.5)


def status_text(capsys, root: Path, *args: str) -> str:
    capsys.readouterr()
    assert main(["status", *args, "--runs-root", str(root)]) == 0
    return capsys.readouterr().out


def test_held_job_status_with_and_without_accounting_then_cancel(slurm_cluster, tmp_path, launched, capsys):
    root = tmp_path / "runs"
    run = preflight(root, capsys, "-o", HOLD)
    launched.append(run)
    st = poll(run, lambda s: s.state == "PENDING" and s.reason == "JobHeldUser")
    assert (st.site, st.attempts) == ("local-slurm", 1)
    assert "state       PENDING (JobHeldUser)" in status_text(capsys, root, run.run_id)
    assert "PENDING (JobHeldUser)" in status_text(capsys, root)  # the table of all runs
    # Without slurmdbd, sacct fails; the controller (squeue) still knows the live job and why it waits.
    slurm_cluster.run("accounting-off")
    try:
        st = poll(run, lambda s: s.source == "squeue", 30)
        assert (st.state, st.reason) == ("PENDING", "JobHeldUser")
        detail = json.loads(status_text(capsys, root, run.run_id, "--json"))
        assert (detail["state"], detail["reason"], detail["source"]) == ("PENDING", "JobHeldUser", "squeue")
        assert [a["job_id"] for a in detail["attempt_records"]] == [st.job_id]
    finally:
        slurm_cluster.run("accounting-on")
    capsys.readouterr()
    assert main(["cancel", run.run_id, "--runs-root", str(root)]) == 0
    assert f"cancel requested for job {st.job_id} of {run.run_id} (was PENDING)" in capsys.readouterr().out
    st = poll(run, lambda s: s.state == "CANCELLED")
    assert run.read_record()["attempts"][-1]["state"] == "CANCELLED"
    assert main(["cancel", run.run_id, "--runs-root", str(root)]) == 0
    assert "already ended (CANCELLED)" in capsys.readouterr().out


def test_cancel_a_running_job(tmp_path, launched, capsys):
    root = tmp_path / "runs"
    # a setup line that keeps the batch script busy: the job is RUNNING until cancelled
    run = preflight(root, capsys, "-o", 'site.env.setup=["sleep 600"]')
    launched.append(run)
    st = poll(run, lambda s: s.state == "RUNNING")
    assert st.reason is None
    capsys.readouterr()
    assert main(["cancel", run.run_id, "--runs-root", str(root)]) == 0
    assert "(was RUNNING)" in capsys.readouterr().out
    st = poll(run, lambda s: s.state == "CANCELLED", 60)
    assert not (run.path / "preflight.json").exists()


def test_sbatch_rejecting_the_job(slurm_cluster, tmp_path, capsys):
    root = tmp_path / "runs"
    rc = main(["submit", str(REPO / "examples" / "arith-tiny.toml"), "--site", "local-slurm", "--no-check-paths", "-q",
               "-o", 'site.slurm.partition="nosuchpartition"', "--runs-root", str(root)])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == SchedulerError.exit_code
    assert err.count("\n") == 1 and err.startswith("hpcppo: error: sbatch rejected the job: ") and "Traceback" not in err
    assert "Invalid partition name specified" in err
    assert sorted(root.iterdir()) == []  # the run directory made for the submission is gone
