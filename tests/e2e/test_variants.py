"""The loop's other branches, end to end on 2 ranks: GRPO without a critic and with the KL loss, the
entropy bonus and a cosine schedule with warm-up; GAE with the adaptive KL controller in the reward and
critic warm-up (the actor stays frozen for the first steps)."""

from __future__ import annotations

import math

import pytest
import torch

from hpcppo import metrics as hmetrics

from _harness import compile_run, launch_ranks, logs_of, wait_all, write_spec


@pytest.mark.slow
def test_grpo_with_kl_loss_entropy_and_cosine_schedule(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    run = compile_run(spec, tmp_path / "runs", [
        "algorithm.adv_estimator=grpo", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.01",
        "actor.kl_loss_type=low_var_kl", "actor.entropy_coeff=0.01", "actor.lr_schedule=cosine",
        "actor.warmup_steps=1", "trainer.total_steps=3", "checkpoint.save_every=0",
    ])
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    df = hmetrics.load(run)
    assert list(df["step"]) == [1, 2, 3]
    assert df["critic/vf_loss"].isna().all()  # no critic with GRPO
    assert df["actor/kl_loss"].notna().all() and df["kl/actor_ref"].notna().all()
    # 3 steps x 2 optimizer steps (16 prompts / 8 per mini-batch): warm-up 1 training step (its 2 optimizer steps,
    # as verl counts warm-up in training steps), then cosine decay.
    lrs = df["actor/lr"].tolist()
    assert lrs[0] == pytest.approx(1e-4) and lrs[-1] < lrs[0], lrs
    assert all(math.isfinite(x) for x in df["actor/pg_loss"])


@pytest.mark.slow
def test_adaptive_kl_in_reward_and_critic_warmup(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    run = compile_run(spec, tmp_path / "runs", [
        "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.kl_coef=0.1",
        "algorithm.kl_ctrl.target_kl=1e-6", "algorithm.kl_ctrl.horizon=10", "critic.warmup_updates=2",
        "trainer.total_steps=4", "checkpoint.save_every=0",
    ])
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    df = hmetrics.load(run).set_index("step")
    # The actor is frozen during critic warm-up: no policy metrics, and the policy equals the reference.
    assert df.loc[[1, 2], "actor/pg_loss"].isna().all() and df.loc[[3, 4], "actor/pg_loss"].notna().all()
    assert df.loc[[1, 2, 3], "kl/actor_ref"].abs().max() < 1e-6
    assert df["critic/vf_loss"].notna().all()
    # Adaptive controller (Ziegler et al.): below target (KL = 0 while the actor is frozen) the coefficient
    # shrinks; once the actor moves, KL exceeds the tiny target and it grows. Row N shows the value used at N.
    assert df.loc[4, "kl/actor_ref"] > 2e-6
    coefs = df["kl/coef"].tolist()
    assert coefs[0] == pytest.approx(0.1) and coefs[0] > coefs[1] > coefs[2] > coefs[3], coefs
    # The checkpoint carries the controller's state, updated by step 4's KL.
    extra = torch.load(run / "checkpoints" / "step-4" / "extra.pt", weights_only=True)
    assert extra["kl_ctrl"]["kind"] == "adaptive" and extra["kl_ctrl"]["value"] > coefs[3]
