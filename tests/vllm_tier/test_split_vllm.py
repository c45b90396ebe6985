"""Split placement with ``rollout.engine = "vllm"`` (vLLM's CPU backend): one trainer rank and one rollout rank whose
engine is a real ``VLLMRolloutEngine`` in a world of its own, fed by the bridge.

On-policy (max_staleness 0) the engine's log-probs of its samples must be the trainer's (``rollout/logprob_gap``
~3e-7 with float32 kernels, as in test_trainer_vllm.py): the weights went trainer -> bridge -> vLLM's reload intact,
every step.
"""

from __future__ import annotations

import pytest
from _harness import compile_run, launch_ranks, logs_of, wait_all, write_spec

from hpcppo import metrics as hmetrics

SYNCED = 1e-5


@pytest.mark.slow
def test_a_vllm_rollout_rank_samples_from_the_trainers_weights(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    run = compile_run(spec, tmp_path / "runs", [
        "rollout.engine=vllm", "rollout.placement=split", "resources.rollout_ranks_per_node=1",
        "site.local.procs_per_node=2", "rollout.max_staleness=0", "trainer.total_steps=3",
        "trainer.val_before_train=false", "trainer.test_freq=0", "checkpoint.save_every=0"])
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    df = hmetrics.load(run)
    assert list(df["step"]) == [1, 2, 3]
    assert (df["rollout/logprob_gap"] < SYNCED).all(), df["rollout/logprob_gap"].tolist()
    assert list(df["rollout/staleness_max"]) == [0.0, 0.0, 0.0]
    log = logs_of(run)
    assert "rollout rank 0 of 1: vllm engine" in log and "rollout rank 0: stopped after 3 unit(s)" in log
