"""Rollout correction in the trainer (2 gloo ranks, the HF engine, float32 everywhere): the engine's log-probs are the
actor's to float precision, so the IS weights are 1 and the losses those of the run without correction; bypass mode
skips the old-log-prob pass and logs its correction from the policy loss. The real mismatch (vLLM bf16 against the
float32 trainer) is the vLLM tier's test."""

from __future__ import annotations

import pytest

from hpcppo import metrics as hmetrics

from _harness import compile_run, launch_ranks, logs_of, wait_all, write_spec

# GAE (the spec's): the untrained model scores 0 everywhere, so only a critic gives non-zero advantages. One
# mini-batch per step: step 1's update starts from the same weights in every run.
COMMON = ["trainer.total_steps=2", "checkpoint.save_every=0", "actor.ppo_mini_batch_size=16"]


def _run(tmp_path, tiny, name, overrides):
    spec = write_spec(tmp_path / f"{name}.toml", tiny, name=name)
    run = compile_run(spec, tmp_path / "runs", COMMON + overrides)
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    return hmetrics.load(run).set_index("step")


@pytest.mark.slow
def test_decoupled_correction_with_matching_engine_is_a_no_op_and_bypass_runs(tmp_path, random_tiny):
    plain = _run(tmp_path, random_tiny, "plain", [])
    corrected = _run(tmp_path, random_tiny, "corrected", [
        "algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_batch_normalize=true",
        "algorithm.rollout_correction.rollout_rs=token_k1,seq_mean_k3",
        "algorithm.rollout_correction.rollout_rs_threshold=0.9_1.1,0.001"])
    assert not any(c.startswith("rollout_corr/") for c in plain.columns)  # off: nothing new is logged
    for col in ("rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_batch_norm_factor",
                "rollout_corr/rollout_is_max", "rollout_corr/rollout_is_min"):
        assert (corrected[col] - 1).abs().max() < 1e-5, corrected[col].tolist()
    assert (corrected["rollout_corr/rollout_rs_masked_fraction"] == 0).all()
    assert corrected["rollout_corr/kl"].abs().max() < 1e-5
    for col in ("actor/pg_loss", "reward/mean", "actor/ppo_kl"):
        assert corrected[col].tolist() == pytest.approx(plain[col].tolist(), rel=1e-4, abs=1e-6), col

    # The weights reach the loss: truncated at 0.5, every weight is 0.5 and step 1's policy gradient is half the plain
    # one (its loss is ~0 here: the token mean of whitened advantages at ratio 1).
    halved = _run(tmp_path, random_tiny, "halved", ["algorithm.rollout_correction.rollout_is=token",
                                                    "algorithm.rollout_correction.rollout_is_threshold=0.5"])
    assert halved.loc[1, "reward/mean"] == plain.loc[1, "reward/mean"]
    assert plain.loc[1, "actor/grad_norm"] > 1e-3  # not a vacuous comparison
    assert halved.loc[1, "actor/grad_norm"] == pytest.approx(0.5 * plain.loc[1, "actor/grad_norm"], rel=1e-4)

    bypass = _run(tmp_path, random_tiny, "bypass", [
        "algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.loss_type=reinforce",
        "algorithm.rollout_correction.rollout_is=sequence", "algorithm.rollout_correction.rollout_rs=token_k3",
        "algorithm.rollout_correction.rollout_rs_threshold=0.5"])
    assert bypass["time/old_logprob_s"].isna().all()  # no old-log-prob pass
    assert bypass["rollout_corr/rollout_is_mean"].notna().all()
    # the first mini-batch of each step is on-policy: pi_theta = pi_rollout, the weights are 1
    assert (bypass["rollout_corr/rollout_is_min"] > 0.5).all()
    assert bypass["actor/pg_loss"].notna().all() and bypass["actor/pg_clipfrac"].isna().all()  # reinforce: no clip
