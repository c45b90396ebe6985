#!/usr/bin/env bash
# In the style of verl's examples/rollout_correction/run_with_rollout_corr_multi_rs.sh (verl b178a3c), our values:
# PPO-clip in bypass mode, token IS for its metrics, two rejection criteria chained, thresholds quoted for Hydra.
set -xeuo pipefail

rs_modes="token_k1,seq_mean_k3"
rs_bounds="0.5_1.5,0.02"

python3 -m verl.trainer.main_ppo \
    data.train_files="/shared/arith/train.parquet" \
    data.val_files="/shared/arith/val.parquet" \
    data.train_batch_size=64 \
    algorithm.adv_estimator=grpo \
    algorithm.rollout_correction.rollout_is=token \
    algorithm.rollout_correction.rollout_is_threshold=1.8 \
    algorithm.rollout_correction.rollout_is_batch_normalize=false \
    algorithm.rollout_correction.rollout_rs=\'${rs_modes}\' \
    algorithm.rollout_correction.rollout_rs_threshold=\'${rs_bounds}\' \
    algorithm.rollout_correction.bypass_mode=true \
    algorithm.rollout_correction.loss_type=ppo_clip \
    actor_rollout_ref.model.path=/shared/models/small \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.rollout.name=vllm \
    trainer.total_epochs=1
