"""``hpcppo preflight`` through the whole launch path on the 2-node dev cluster.

Compile -> run directory -> submitit submits job.sbatch verbatim -> srun starts one rank per node ->
torch.distributed (gloo) rendezvous at the first node, all-reduce checks -> preflight.json; then a
requeue runs the same job again as attempt 1 with its own log directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcppo import jobenv
from hpcppo.cli import main
from hpcppo.launch import slurm, status
from hpcppo.rundir import RunDir, list_runs

pytestmark = pytest.mark.slurm




def only_run(root: Path) -> RunDir:
    [run] = list_runs(root)
    return run


def wait_final(run: RunDir, timeout_s: float = 120) -> status.JobStatus:
    st = status.wait_for(run, poll_s=0.5, timeout_s=timeout_s)
    assert st.state in status.FINAL_STATES, f"{run.run_id} still {st} after {timeout_s} s"
    return st


def test_one_node_preflight_runs_exactly_job_sbatch(tmp_path, launched, capsys):
    # shell syntax and a space in the runs root: directives and script must quote it
    root = tmp_path / "runs $(touch pwned) x"
    rc = main(["preflight", "--site", "local-slurm", "--nodes", "1", "--no-wait", "-q", "--runs-root", str(root)])
    assert rc == 0, capsys.readouterr().err
    run = only_run(root)
    launched.append(run)
    record = run.read_record()
    [attempt] = record["attempts"]
    job_id = attempt["job_id"]
    assert attempt["scheduler"] == "slurm" and attempt["kind"] == "submit" and attempt["submitted_at"]
    assert f"submitted {run.run_id} as job {job_id} (local-slurm)" in capsys.readouterr().out
    # what Slurm stored is our file, byte for byte (submitit's private hook is still in effect)
    assert slurm.batch_script(job_id) == run.script.read_text()

    st = wait_final(run)
    assert st.state == "COMPLETED", st
    report = json.loads((run.path / "preflight.json").read_text())
    assert report["ok"] and report["world_size"] == 1 and report["backend"] == "gloo"
    assert report["nodes"] in (["n1"], ["n2"])
    assert all(check["ok"] for check in report["checks"].values()), report["checks"]
    assert [r["slurm"]["SLURM_JOB_ID"] for r in report["ranks"]] == [job_id]
    assert (run.logs / f"attempt-{job_id}.0" / "rank-0.log").is_file()
    assert not any((d / "pwned").exists() for d in (tmp_path, root, run.path, Path.cwd()))
    # status: site, job, final state, attempts, elapsed; the final state is recorded in run.json
    st = status.run_status(run)
    assert (st.site, st.job_id, st.state, st.attempts, st.restarts) == ("local-slurm", job_id, "COMPLETED", 1, 0)
    assert st.elapsed_s is not None and st.elapsed_s > 0
    assert run.read_record()["attempts"][0]["state"] == "COMPLETED"


def test_two_node_preflight_then_a_requeue_is_attempt_one(tmp_path, launched, capsys, wait_for_state):
    root = tmp_path / "runs"
    rc = main(["preflight", "--site", "local-slurm", "--nodes", "2", "-q", "--runs-root", str(root)])
    out = capsys.readouterr().out
    run = only_run(root)
    launched.append(run)
    assert rc == 0, out
    assert "preflight OK: world size 2 on n1, n2 (gloo)" in out
    job_id = run.read_record()["attempts"][0]["job_id"]
    report = json.loads((run.path / "preflight.json").read_text())
    # ranks 0-1 on n1 and n2, rendezvous at n1 on the port derived from the job id
    assert [(r["rank"], r["host"]) for r in report["ranks"]] == [(0, "n1"), (1, "n2")]
    assert report["master"] == f"n1:{jobenv.PORT_BASE + int(job_id) % jobenv.PORT_SPAN}"
    assert report["checks"]["ranks"] == {"ok": True, "seen": [0, 1]}
    assert report["checks"]["allreduce"]["ok"] and report["checks"]["world_size"]["actual"] == 2
    first_finish = report["finished_at"]

    # Requeue the finished job and skip the BeginTime Slurm adds: the same job runs as attempt 1.
    slurm.requeue(job_id)
    slurm.update_start_now(job_id)
    wait_for_state(job_id, {"COMPLETED"}, 120, condition=lambda i: i.restart_count == 1)
    st = status.run_status(run)
    assert (st.state, st.restarts, st.attempts) == ("COMPLETED", 1, 1)
    for attempt in (0, 1):
        logs = run.logs / f"attempt-{job_id}.{attempt}"
        assert sorted(p.name for p in logs.iterdir()) == ["rank-0.log", "rank-1.log", "versions.json"]
        assert json.loads(run.versions(f"{job_id}.{attempt}").read_text())["torch"].startswith("2.")
        assert (run.control / f"exit-code.{job_id}.{attempt}").read_text().strip() == "0"
    report = json.loads((run.path / "preflight.json").read_text())
    assert report["finished_at"] >= first_finish and {r["slurm"]["SLURM_RESTART_COUNT"] for r in report["ranks"]} == {"1"}
    capsys.readouterr()
    assert main(["status", run.run_id, "--runs-root", str(root)]) == 0
    text = capsys.readouterr().out
    assert "state       COMPLETED" in text and "restarts    1" in text and f"job         {job_id}" in text
