"""A node that fails under a running job (the fault matrix's Slurm row): Slurm ends the 2-node job NODE_FAIL,
`hpcppo status` says so and that it is resumable from its last checkpoint, and once the node is back a resume
finishes the run with every step logged exactly once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from _harness import logs_of, rows_logged, write_spec  # noqa: E402

from hpcppo import metrics as hmetrics  # noqa: E402
from hpcppo.launch import jobs, slurm  # noqa: E402
from hpcppo.launch.status import run_status  # noqa: E402



def _node(name: str, state: str) -> None:
    subprocess.run(["scontrol", "update", f"nodename={name}", f"state={state}"]
                   + (["reason=fault matrix: node failure"] if state == "down" else []),
                   check=state == "down", capture_output=True, timeout=30)  # a node back by itself refuses resume


def _idle(name: str) -> bool:
    out = subprocess.run(["sinfo", "-h", "-n", name, "-o", "%T"], capture_output=True, text=True, timeout=30).stdout
    return out.strip() in ("idle", "mixed", "allocated")


def test_a_node_failure_is_node_fail_and_the_resume_finishes(slurm_cluster, random_tiny, tmp_path, wait_until,
                                                              launched):
    spec = write_spec(tmp_path / "exp.toml", random_tiny, name="slurm-node-fail")
    # No requeue: Slurm would requeue a NODE_FAIL job by itself; here the user decides, with status telling the truth.
    crun = jobs.compile_run(spec, "local-slurm", ["trainer.total_steps=40", "checkpoint.save_every=2",
                                                  "watchdog.enable=false", "site.slurm.requeue=false"],
                            runs_root=str(tmp_path / "runs"))
    run = crun.run
    launched.append(run)
    job_id = jobs.submit_run(crun)
    wait_until(lambda: run_status(run).latest_checkpoint is not None and rows_logged(run.path) >= 3, 240,
               "a checkpoint and three steps", run.path)
    node = slurm.query_jobs([job_id])[job_id]
    try:
        _node("n2", "down")
        wait_until(lambda: slurm.query_jobs([job_id])[job_id].is_finished, 120, "the end of the job", run.path)
        assert slurm.query_jobs([job_id])[job_id].state == "NODE_FAIL", node
        st = run_status(run)
        assert st.state == "NODE_FAIL" and st.resumable, st
        ckpt = st.latest_checkpoint
        # The trainers may or may not checkpoint in the seconds Slurm gives a downed node's tasks; either way:
        assert ckpt is not None and ckpt >= 2 and st.reason.startswith("a node of the job failed"), st
        assert st.reason.endswith(f"resumable, checkpoint {ckpt}"), st
    finally:
        _node("n2", "resume")
        wait_until(lambda: _idle("n2"), 60, "node n2 back in service", run.path)
    jobs.resume_run(run)
    wait_until(lambda: run_status(run).state == "COMPLETED", 480, "the resumed run", run.path)
    df = hmetrics.load(run.path)
    assert list(df["step"]) == list(range(1, 41)), logs_of(run.path)
    assert set(df["attempt"]) == {0, 1}
    # Attempt 1 starts after a checkpoint no older than the one status named: the ranks on the surviving node may
    # still commit one while Slurm already reports the job over (the tasks get SIGTERM, then KillWait seconds).
    attempts = df["attempt"].tolist()
    resumed_from = attempts.index(1)
    assert attempts == [0] * resumed_from + [1] * (40 - resumed_from) and resumed_from >= ckpt, attempts
