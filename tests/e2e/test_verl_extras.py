"""What verl users reach for, end to end on the arithmetic task (issue 23), in short runs sharing the checks:
validation at n responses per prompt (verl's mean@n, best@k, worst@k, maj@k per data source) with the clip_cov loss,
ReMax's greedy baseline and both trackers (TensorBoard, wandb offline); the gspo loss with the GPG estimator; the
optimal token baseline with its sum_pi_squared (issue 33)."""

from __future__ import annotations

import math

import pytest

from hpcppo import metrics as hmetrics
from hpcppo.rundir import RunPaths, metric_names

from _harness import compile_run, launch_ranks, logs_of, wait_all, write_spec
from trackerfiles import tensorboard_scalars, wandb_records


@pytest.mark.slow
def test_validation_at_n_with_clip_cov_and_remax(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    run = compile_run(spec, tmp_path / "runs", [
        "rollout.val_n=4", "rollout.val_temperature=1.0", "trainer.val_before_train=true", "trainer.test_freq=2",
        "actor.policy_loss.loss_mode=clip_cov", "actor.policy_loss.clip_cov_ratio=0.05",
        "actor.policy_loss.clip_cov_lb=-1.0", "algorithm.adv_estimator=remax",
        "trainer.logger=['console','tensorboard','wandb']", "trainer.project_name=issue23",
        "trainer.total_steps=2", "checkpoint.save_every=0",
    ])
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    df = hmetrics.load(run).set_index("step")
    for stat in metric_names.validation_stats(4):
        col = f"val/score/hpcppo/arith/{stat}"
        assert df.loc[[0, 2], col].notna().all(), col  # before training and at step 2; maj@k from arith's pred
        assert math.isnan(df.loc[1, col]), col
    val = df.loc[[0, 2]]
    # mean@4 over prompts of 4 samples each is the plain mean; best >= mean >= worst.
    assert (val["val/score/hpcppo/arith/mean@4"] - val["val/score/hpcppo/arith"]).abs().max() < 1e-9
    assert (val["val/score/hpcppo/arith/best@4/mean"] >= val["val/score/hpcppo/arith/mean@4"]).all()
    assert (val["val/score/hpcppo/arith/worst@4/mean"] <= val["val/score/hpcppo/arith/mean@4"]).all()
    train = df.loc[[1, 2]]
    # clip_cov cut 5% of the tokens (the random model scores 0: every covariance is 0, inside (-1, 5)), and it reports
    # no pg_clipfrac_lower (verl's metrics).
    assert (train["actor/pg_clipfrac"] > 0).any() and train["actor/pg_clipfrac_lower"].isna().all()
    assert train["critic/vf_loss"].isna().all()  # ReMax trains no critic
    assert "greedy baseline" in logs_of(run)
    # The trackers hold the rows of the HDF5 log: TensorBoard's reader, wandb's offline run records.
    tb = tensorboard_scalars(RunPaths(run).tensorboard)
    assert [s for s, _ in tb["val/score/hpcppo/arith/maj@4/mean"]] == [0, 2]
    assert [v for _, v in tb["reward/mean"]] == pytest.approx(df.loc[[1, 2], "reward/mean"].tolist())
    [wandb_file] = RunPaths(run).wandb.glob("offline-run-*/run-*.wandb")
    records = wandb_records(wandb_file)
    assert [r.run.project for r in records if r.WhichOneof("record_type") == "run"] == ["issue23"]
    history = [{(i.key or "/".join(i.nested_key)): i.value_json for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [h.get("_step") for h in history] == ["0", "1", "2"], history


@pytest.mark.slow
def test_gspo_with_the_gpg_estimator(tmp_path, warm_tiny):
    root, _ = warm_tiny  # the example's warm-started model: rewards vary within a group, so advantages are not 0
    spec = write_spec(tmp_path / "exp.toml", {"model": root / "model", "train": root / "data" / "train.parquet",
                                              "val": root / "data" / "val.parquet"})
    run = compile_run(spec, tmp_path / "runs", [
        "actor.policy_loss.loss_mode=gspo", "actor.clip_ratio_low=0.0003", "actor.clip_ratio_high=0.0004",
        "algorithm.adv_estimator=gpg", "trainer.total_steps=2", "checkpoint.save_every=0",
    ])
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    df = hmetrics.load(run).set_index("step")
    assert df["actor/pg_loss"].notna().all() and (df["actor/pg_clipfrac_lower"] == 0).all()
    # GSPO's clip range is per sequence and tiny: after the first mini-batch the sequence ratios leave it.
    assert (df["actor/pg_clipfrac"] > 0).any()


@pytest.mark.slow
def test_the_optimal_token_baseline_trains(tmp_path, warm_tiny):
    """verl's optimal_token_baseline: the old-log-prob pass (here packed, under a token budget) gives sum_pi_squared,
    the estimator reads it with the rollout's IS weights (decoupled correction), and the actor trains on non-zero
    advantages."""
    root, _ = warm_tiny  # rewards vary within a group, so the advantages are not all 0
    spec = write_spec(tmp_path / "exp.toml", {"model": root / "model", "train": root / "data" / "train.parquet",
                                              "val": root / "data" / "val.parquet"})
    run = compile_run(spec, tmp_path / "runs", [
        "algorithm.adv_estimator=optimal_token_baseline", "algorithm.rollout_correction.rollout_is=token",
        "model.remove_padding=true", "rollout.max_tokens_per_micro_batch=56", "rollout.temperature=0.8",
        "trainer.total_steps=2", "checkpoint.save_every=0",
    ])
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    df = hmetrics.load(run).set_index("step")
    for col in ("actor/pg_loss", "actor/grad_norm", "advantages/mean", "advantages/std", "rollout_corr/kl"):
        assert df[col].map(math.isfinite).all(), (col, df[col].tolist())
    assert (df["advantages/std"] > 0).all() and (df["actor/grad_norm"] > 0).all()
    assert df["critic/vf_loss"].isna().all()  # no critic
