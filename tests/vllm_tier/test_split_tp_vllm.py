"""Split placement with a tensor-parallel rollout engine (vLLM's CPU backend): one trainer rank and two rollout ranks
that form ONE engine at ``rollout.tensor_parallel_size = 2`` (hpcppo.rollout.split.engine_of), in a world of their
own, both fed by the bridge.

On-policy (max_staleness 0) the engine's log-probs of its samples must be the trainer's within test_split_vllm.py's
tolerance: both ranks received every broadcast and loaded their own shard through vLLM's reload, and generated the
same unit in step (only the first sends it). The rollout ranks also validate (before training and after step 3):
the trainer rank holds no engine, and the TP-2 engine generates the validation set in step as it does the units.

About a minute on 2 busy cores (56 s measured), as test_split_vllm.py: slow, in the vLLM tier
(``.venv-vllm/bin/python -m pytest -m vllm tests/vllm_tier/test_split_tp_vllm.py``).
"""

from __future__ import annotations

import pytest
from _harness import compile_run, launch_ranks, logs_of, wait_all, write_spec

from hpcppo import metrics as hmetrics

SYNCED = 1e-5  # test_split_vllm.py's


@pytest.mark.slow
def test_a_tensor_parallel_vllm_engine_of_two_rollout_ranks_samples_from_the_trainers_weights(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    run = compile_run(spec, tmp_path / "runs", [
        "rollout.engine=vllm", "rollout.placement=split", "resources.rollout_ranks_per_node=2",
        "rollout.tensor_parallel_size=2", "site.local.procs_per_node=3", "rollout.max_staleness=0",
        "trainer.total_steps=3", "trainer.val_before_train=true", "trainer.test_freq=3", "checkpoint.save_every=0"])
    # the wait ends below pytest's timeout, so that the harness ends the ranks of a hung run
    assert wait_all(launch_ranks(run, 3, "a0"), timeout=420) == [0, 0, 0], logs_of(run)
    everything = hmetrics.load(run)
    assert list(everything.loc[everything["val/score"].notna(), "step"]) == [0, 3]
    assert everything["val/score"].dropna().between(0, 1).all()
    df = everything[everything["step"] > 0]
    assert list(df["step"]) == [1, 2, 3]
    assert (df["rollout/logprob_gap"] < SYNCED).all(), df["rollout/logprob_gap"].tolist()
    assert list(df["rollout/staleness_max"]) == [0.0, 0.0, 0.0]
    log = logs_of(run)
    assert "rollout rank 0 of 2: vllm engine 0 (tensor-parallel rank 0 of 2)" in log
    assert "rollout rank 1 of 2: vllm engine 0 (tensor-parallel rank 1 of 2)" in log
    # the engine's first rank sent the 3 units, the second none: one engine, not two
    assert "rollout rank 0: stopped after 3 unit(s)" in log and "rollout rank 1: stopped after 0 unit(s)" in log
