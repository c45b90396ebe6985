"""The trainer with ``rollout.engine = "vllm"`` (vLLM's CPU backend, 2 gloo ranks, each with its own engine):
it learns the tiny task like the HF engine does, two runs with the same seed generate the same rollouts, a
watchdog rollback and a kill + resume both continue with an engine that holds the actor's current weights, and the
same spec runs as a 2-node Slurm job.

"Holds the actor's current weights" is measured on every step: ``rollout/logprob_gap`` is the mean
|log-prob vLLM reported - log-prob the FSDP actor recomputes| of the sampled tokens. With the weights synced it is
~3e-7 (float32 kernels); an engine one update behind would be off by the update itself.
"""

from __future__ import annotations

import pytest
from _harness import REPO, comparable, compile_run, kill_at_commit, launch_ranks, logs_of, wait_all, write_spec

from hpcppo import metrics as hmetrics
from hpcppo.cli import main
from hpcppo.rundir import events
from hpcppo.rundir import list_runs

VLLM = ["rollout.engine=vllm"]
SYNCED = 1e-5  # rollout/logprob_gap bound: the engine's log-probs are the actor's


def _submit_arith(root, runs, *overrides) -> int:
    return main([
        "submit", str(REPO / "examples" / "arith-tiny.toml"), "--site", "local", "--wait", "-q", "--runs-root",
        str(runs), "-o", f"model.path={root / 'model'}",
        "-o", f"data.train_files=['{root / 'data' / 'train.parquet'}']",
        "-o", f"data.val_files=['{root / 'data' / 'val.parquet'}']",
        "-o", "checkpoint.save_every=0", *(x for o in (*VLLM, *overrides) for x in ("-o", o)),
    ])


def _logs(run) -> str:
    return "\n".join(p.read_text() for p in run.logs.rglob("*.log"))


@pytest.mark.slow
def test_ppo_with_vllm_raises_reward_and_a_seed_repeats_its_rollouts(tmp_path, warm_tiny, capsys):
    root, _ = warm_tiny
    code = _submit_arith(root, tmp_path / "a", "trainer.total_steps=12", "trainer.test_freq=12")
    out = capsys.readouterr().out
    (run,) = list_runs(tmp_path / "a")
    assert code == 0, out + _logs(run)
    assert "engine vllm" in _logs(run)  # the engine the spec named is the one that ran
    df = hmetrics.load(run.path)
    train = df[df["step"] > 0]
    assert list(train["step"]) == list(range(1, 13))
    # the thresholds of the HF engine's learning test (tests/e2e/test_learns.py)
    start, end = train["reward/mean"].head(2).mean(), train["reward/mean"].tail(4).mean()
    assert 0.05 < start < 0.5, start
    assert end > start + 0.15, (start, end, train["reward/mean"].tolist())
    val = df[df["val/score"].notna()]
    assert val["val/score"].iloc[-1] > val["val/score"].iloc[0] + 0.1, val["val/score"].tolist()
    assert (train["rollout/logprob_gap"] < SYNCED).all(), train["rollout/logprob_gap"].tolist()

    # The same seed on the same world size: the same rollouts (rewards and lengths), hence the same updates.
    code = _submit_arith(root, tmp_path / "b", "trainer.total_steps=3", "trainer.test_freq=0",
                         "trainer.val_before_train=false")
    (again,) = list_runs(tmp_path / "b")
    assert code == 0, _logs(again)
    first = train.set_index("step").loc[[1, 2, 3]]
    second = hmetrics.load(again.path).set_index("step").loc[[1, 2, 3]]
    for column in ("reward/mean", "response/length_mean", "actor/pg_loss"):
        assert first[column].tolist() == second[column].tolist(), column


KL_SPEC = """
[algorithm]
use_kl_in_reward = true
"""


@pytest.mark.slow
def test_rollback_and_kill_resume_continue_with_the_actors_weights(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny, extra=KL_SPEC)
    overrides = VLLM + ["actor.lr=2e-5", "trainer.total_steps=8", "checkpoint.save_every=2",
                        "debug.inject.kl_spike_at_step=5"]
    straight = compile_run(spec, tmp_path / "runs", overrides)
    assert wait_all(launch_ranks(straight, 2, "a0")) == [0, 0], logs_of(straight)
    rollback = next(e for e in events.read_events(straight) if e["kind"] == "watchdog.rollback")
    assert (rollback["step"], rollback["checkpoint"]) == (5, 4)
    df = hmetrics.load(straight)
    assert list(df["step"]) == list(range(1, 9))
    # every step, the retried step 5 after the rollback included, sampled from the actor's current weights
    assert (df["rollout/logprob_gap"] < SYNCED).all(), df[["step", "rollout/logprob_gap"]]

    # Killed after the rollback (at the commit of step 6) and resumed: a fresh engine, synced before its first
    # rollout, and the same run as the straight one, row for row.
    resumed = compile_run(spec, tmp_path / "runs", overrides)
    kill_at_commit(resumed, 6, launch_ranks(resumed, 2, "a0"))
    assert wait_all(launch_ranks(resumed, 2, "a1")) == [0, 0], logs_of(resumed)
    after = hmetrics.load(resumed)
    assert sorted(set(after["attempt"])) == [0, 1]
    assert (after["rollout/logprob_gap"] < SYNCED).all(), after[["step", "attempt", "rollout/logprob_gap"]]
    a, b = comparable(df), comparable(after)
    assert a.equals(b), (a - b).abs().max().sort_values().tail(10)


@pytest.mark.slurm
@pytest.mark.slow
def test_vllm_run_on_two_slurm_nodes(slurm_cluster, random_tiny, tmp_path, wait_until):
    from hpcppo.launch import jobs, slurm
    from hpcppo.launch.status import run_status
    from hpcppo.rundir import RunDir

    spec = write_spec(tmp_path / "exp.toml", random_tiny, name="slurm-vllm")
    crun = jobs.compile_run(spec, "local-slurm", [*VLLM, "trainer.total_steps=4", "checkpoint.save_every=0"],
                            runs_root=str(tmp_path / "runs"))
    assert crun.compiled.plan.nodes == 2 and crun.compiled.plan.world_size == 2
    run = crun.run
    job_id = jobs.submit_run(crun)
    wait_until(lambda: slurm.query_jobs([job_id])[job_id].state not in ("PENDING", "RUNNING", "CONFIGURING",
                                                                        "COMPLETING"),
               300, "the job to end", run.path)
    assert run_status(RunDir(run.path)).state == "COMPLETED", logs_of(run.path)
    df = hmetrics.load(run.path)
    assert list(df["step"]) == list(range(1, 5))
    assert (df["rollout/logprob_gap"] < SYNCED).all(), df["rollout/logprob_gap"].tolist()
    ranks = "\n".join(p.read_text() for p in (run.path / "logs").rglob("rank-*.log"))
    assert "engine vllm" in ranks and "Initializing a V1 LLM engine (v0.32.0)" in ranks
