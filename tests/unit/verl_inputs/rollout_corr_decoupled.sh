#!/usr/bin/env bash
# Decoupled mode (three policies) as verl's RolloutCorrectionConfig.decoupled_k3_rs_token_tis preset sets it, with
# our thresholds, and a k1 sequence filter given as one number (its reciprocal is the lower ratio bound).
set -xeuo pipefail
python3 -m verl.trainer.main_ppo \
    data.train_files="/shared/arith/train.parquet" \
    data.train_batch_size=64 \
    algorithm.adv_estimator=grpo \
    algorithm.rollout_correction.rollout_is=token \
    algorithm.rollout_correction.rollout_is_threshold=2.5 \
    algorithm.rollout_correction.rollout_rs=\'seq_mean_k3,seq_sum_k1\' \
    algorithm.rollout_correction.rollout_rs_threshold=\'0.005,4\' \
    actor_rollout_ref.model.path=/shared/models/small \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.policy_loss.loss_mode=sapo \
    actor_rollout_ref.actor.tau_neg=1.2 \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.name=vllm \
    trainer.total_epochs=1
