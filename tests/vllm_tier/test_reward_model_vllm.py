"""A reward model with ``rollout.engine = "vllm"`` (issue 23): the reward phase reads the engine's responses, not the
engine, so the reward model's scores are the run's scores with vLLM's CPU backend as with the HF engine."""

from __future__ import annotations

import pytest
from _harness import compile_run, launch_ranks, logs_of, wait_all, write_spec

from hpcppo import metrics as hmetrics


@pytest.mark.slow
def test_a_reward_model_scores_vllms_responses(tmp_path, random_tiny, random_tiny_rm):
    spec = write_spec(tmp_path / "exp.toml", random_tiny,
                      extra=f'[reward_model]\nenable = true\npath = "{random_tiny_rm}"\n')
    run = compile_run(spec, tmp_path / "runs", ["rollout.engine=vllm", "trainer.total_steps=2",
                                                "checkpoint.save_every=0", "trainer.test_freq=-1"])
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    assert "engine vllm" in logs_of(run)
    df = hmetrics.load(run).set_index("step").loc[[1, 2]]
    assert df["reward_model/score_mean"].notna().all()
    assert (df["score/mean"] - df["reward_model/score_mean"]).abs().max() < 1e-5
    assert (df["reward_model/score_max"] > df["reward_model/score_min"]).all()
    assert (df["rollout/logprob_gap"] < 1e-5).all()  # the engine sampled from the actor's weights
