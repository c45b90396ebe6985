#!/usr/bin/env bash
# A verl launch in the style of examples/rollout_correction/run_with_rollout_corr.sh (verl b178a3c), with our own
# values: REINFORCE in bypass mode with batch-normalised sequence-level IS, no rejection.
set -xeuo pipefail

is_level="sequence"
is_cap=3.0
is_self_norm="true"
rs_modes="null"
rs_bounds="null"
skip_old_logprob="true"
pg_loss="reinforce"

python3 -m verl.trainer.main_ppo \
    data.train_files="/shared/arith/train.parquet" \
    data.val_files="/shared/arith/val.parquet" \
    data.max_prompt_length=256 \
    data.max_response_length=512 \
    data.train_batch_size=64 \
    algorithm.adv_estimator=rloo \
    algorithm.rollout_correction.rollout_is=${is_level} \
    algorithm.rollout_correction.rollout_is_threshold=${is_cap} \
    algorithm.rollout_correction.rollout_is_batch_normalize=${is_self_norm} \
    algorithm.rollout_correction.rollout_rs=${rs_modes} \
    algorithm.rollout_correction.rollout_rs_threshold=${rs_bounds} \
    algorithm.rollout_correction.bypass_mode=${skip_old_logprob} \
    algorithm.rollout_correction.loss_type=${pg_loss} \
    actor_rollout_ref.model.path=/shared/models/small \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.name=vllm \
    trainer.total_epochs=2
