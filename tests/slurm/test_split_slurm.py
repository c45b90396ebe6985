"""Split placement on the 2-node dev cluster (issue 35): one allocation, one ``srun``, node n1's task trains and node
n2's generates (``resources.rollout_nodes = 1``), the bridge between them; ``max_staleness = 2``.

Two jobs of the same spec run side by side (each takes one CPU of each node): one uninterrupted, one sent USR2 (what
``--signal=USR2@lead`` sends) after its second step: its trainer checkpoints with the queued units, both tasks exit,
the batch script requeues the job, and the next attempt resumes. The two runs' metrics are equal step for step:
the checkpoint held the samples the rollout rank had made ahead, and the rollout rank of the new attempt continued
from the first unit the trainer did not hold, with the weights the uninterrupted run used for it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from _harness import comparable, logs_of, rows_logged, write_spec  # noqa: E402

from hpcppo import metrics as hmetrics  # noqa: E402
from hpcppo.launch import jobs, slurm  # noqa: E402
from hpcppo.launch.status import run_status  # noqa: E402
from hpcppo.rundir import RunDir  # noqa: E402

SPLIT = ["rollout.placement=split", "resources.rollout_nodes=1", "rollout.max_staleness=2", "trainer.total_steps=8",
         "checkpoint.save_every=0", "trainer.val_before_train=true", "trainer.test_freq=4"]


def _all_logs(run: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((run / "logs").rglob("*.log")))


def test_a_preempted_split_job_requeues_and_repeats_the_uninterrupted_one(slurm_cluster, random_tiny, tmp_path,
                                                                          wait_until):
    spec = write_spec(tmp_path / "exp.toml", random_tiny, name="slurm-split")
    straight = jobs.compile_run(spec, "local-slurm", SPLIT, runs_root=str(tmp_path / "runs"))
    preempted = jobs.compile_run(spec, "local-slurm", SPLIT, runs_root=str(tmp_path / "runs"))
    plan = preempted.compiled.plan
    assert (plan.nodes, plan.world_size, plan.train_dp_size, plan.rollout_ranks) == (2, 2, 1, 1)
    ids = {"straight": jobs.submit_run(straight), "preempted": jobs.submit_run(preempted)}
    run = preempted.run.path
    job_id = ids["preempted"]
    wait_until(lambda: rows_logged(run) >= 3, 240, "two training steps", run)  # step 0's validation row and 2 steps
    slurm.cancel(job_id, signal="USR2")
    wait_until(lambda: slurm.query_jobs([job_id])[job_id].state in ("PENDING", "REQUEUED"), 180, "the requeue", run)
    wait_until(lambda: slurm.query_jobs([job_id])[job_id].state == "PENDING", 60, "PENDING after requeue", run)
    slurm.update_start_now(job_id)
    for name, crun in (("straight", straight), ("preempted", preempted)):
        wait_until(lambda: slurm.query_jobs([ids[name]])[ids[name]].state == "COMPLETED", 300, f"the {name} job",
                   crun.run.path)

    a, b = hmetrics.load(straight.run.path), hmetrics.load(run)
    assert sorted(set(b["attempt"])) == [0, 1], b[["step", "attempt"]]
    assert list(comparable(b).index) == list(range(0, 9))
    assert comparable(b).equals(comparable(a)), (comparable(a) - comparable(b)).abs().max().sort_values().tail(8)
    assert list(a["rollout/staleness_max"].dropna()) == [0.0, 1.0] + [2.0] * 6
    assert list(a.loc[a["val/score"].notna(), "step"]) == [0, 4, 8]  # the rollout rank validated
    logs = _all_logs(run)
    assert "resumed from checkpoint step" in logs and "unit(s) restored from the checkpoint" in logs, logs_of(run)
    assert "rollout rank 0 of 1" in logs  # node n2's task generated
    kinds = list(hmetrics.load_events(run)["kind"])
    assert "preempted" in kinds and "resume" in kinds
    status = run_status(RunDir(run))
    assert status.state == "COMPLETED" and status.restarts == 1
