"""A reward model and DAPO's overlong buffer end to end (issue 23), two short 2-rank runs of the real job entry point:
the reward model's score is the run's score (verl's rm_scores replace the rule-based one) while validation stays
rule-based, and ReMax's greedy baseline is scored by the model; DAPO's penalty reaches the score and is logged."""

from __future__ import annotations

import pytest

from hpcppo import metrics as hmetrics

from _harness import compile_run, launch_ranks, logs_of, wait_all, write_spec

SHORT = ["trainer.total_steps=2", "checkpoint.save_every=0", "trainer.test_freq=2"]


@pytest.mark.slow
def test_the_reward_models_score_is_the_runs_score(tmp_path, random_tiny, random_tiny_rm):
    spec = write_spec(tmp_path / "exp.toml", random_tiny,
                      extra=f'[reward_model]\nenable = true\npath = "{random_tiny_rm}"\nmax_length = 12\n')
    # ReMax: its greedy baseline is scored by the reward model too, as verl's fit does (rm_scores of the baseline)
    run = compile_run(spec, tmp_path / "runs", SHORT + ["algorithm.adv_estimator=remax"])
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    assert "greedy baseline" in logs_of(run)
    df = hmetrics.load(run).set_index("step")
    for name in ("reward_model/score_mean", "reward_model/score_max", "reward_model/score_min",
                 "reward_model/truncated_frac"):
        assert df.loc[[1, 2], name].notna().all(), name
    # the model's scores are the token-level scores, unchanged (random model: not the rule's 0/1)
    assert (df.loc[[1, 2], "score/mean"] - df.loc[[1, 2], "reward_model/score_mean"]).abs().max() < 1e-5
    assert (df["reward_model/score_max"] > df["reward_model/score_min"]).loc[[1, 2]].all()
    assert df.loc[[1, 2], "score/mean"].abs().min() > 0 and (df["reward_model/truncated_frac"].loc[[1, 2]] > 0).all()
    assert 0.0 <= df.loc[2, "val/score"] <= 1.0  # validation scores with the rule, as verl's _validate


@pytest.mark.slow
def test_dapos_overlong_penalty_reaches_the_score_and_is_logged(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny, extra='[reward_manager]\nname = "dapo"\n'
                      '[reward_manager.overlong_buffer]\nenable = true\nlen = 8\npenalty_factor = 0.5\nlog = true\n')
    run = compile_run(spec, tmp_path / "runs", SHORT)
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    df = hmetrics.load(run).set_index("step").loc[[1, 2]]
    # max_resp_len = len = 8: every response is over the expected length 0, by its length: -L / 8 * 0.5
    assert (df["reward_manager/overlong_frac"] == 1.0).all()
    expect = -df["response/length_mean"] / 8 * 0.5
    assert (df["reward_manager/overlong_reward_mean"] - expect).abs().max() < 1e-6
    assert (df["score/mean"] <= df["reward_manager/overlong_reward_mean"] + 1.0 + 1e-6).all()
    assert (df["score/mean"] < 0).any()  # the untrained model scores ~0 by the rule: the penalty dominates
    # validation: val/score is verl's reward (with the penalty), val/acc its acc (before it, verl's val-core then);
    # every response is penalised here, so acc is above the score for each data source
    sources = [c[len("val/acc/"):] for c in df.columns if c.startswith("val/acc/")]
    assert sources and sorted(sources) == sorted(c[len("val/score/"):] for c in df.columns
                                                 if c.startswith("val/score/"))
    for src in sources:
        acc, score = df.loc[2, f"val/acc/{src}"], df.loc[2, f"val/score/{src}"]
        assert 0.0 <= acc <= 1.0 and score < acc, (src, acc, score)
