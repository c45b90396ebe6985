"""PPO math with verl's semantics: advantages, losses, KL estimators and controllers, masked statistics.

Pure tensor functions: no config objects, no torch.distributed, no ``.item()`` (the one host read is inside the
adaptive/step KL controllers' ``next_coef``). Shapes are ``[batch, response_len]``; see each submodule's docstring.
"""

from __future__ import annotations

from hpcppo.algos.advantages import (
    gae,
    gpg_advantage,
    group_ids,
    grpo_advantage,
    reinforce_pp_advantage,
    reinforce_pp_baseline_advantage,
    remax_advantage,
    rloo_advantage,
)
from hpcppo.algos.baselines import (
    grpo_passk_advantage,
    opo_advantage,
    optimal_token_baseline_advantage,
    tir_optimal_token_baseline_advantage,
)
from hpcppo.algos.kl import (
    KL_CONTROLLERS,
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    StepKLController,
    apply_kl_penalty,
    build_kl_controller,
    kl_penalty,
)
from hpcppo.algos.losses import (
    LOSS_AGG_MODES,
    GlobalBatchInfo,
    agg_loss,
    entropy_from_logits,
    entropy_loss,
    entropy_metric,
    policy_loss,
    value_loss,
)
from hpcppo.algos.policy_losses import (
    POLICY_LOSSES,
    PolicyLossParams,
    compute_policy_loss,
    register_policy_loss,
    reinforce_loss,
)
from hpcppo.algos.rollout_correction import (
    RolloutCorrectionParams,
    compute_offpolicy_metrics,
    compute_rollout_correction_and_rejection_mask,
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
)
from hpcppo.algos.registry import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimator,
    AdvantageInputs,
    compute_advantage,
    needs_critic,
    register_advantage_estimator,
)
from hpcppo.algos.stats import (
    explained_variance,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    reverse_linear_scan,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_CONTROLLERS",
    "KL_KINDS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "AdvantageInputs",
    "FixedKLController",
    "GlobalBatchInfo",
    "KLController",
    "PolicyLossParams",
    "RolloutCorrectionParams",
    "StepKLController",
    "agg_loss",
    "apply_kl_penalty",
    "build_kl_controller",
    "compute_advantage",
    "compute_offpolicy_metrics",
    "compute_rollout_correction_and_rejection_mask",
    "compute_rollout_correction_weights",
    "compute_rollout_rejection_mask",
    "compute_policy_loss",
    "entropy_from_logits",
    "entropy_loss",
    "entropy_metric",
    "explained_variance",
    "gae",
    "gpg_advantage",
    "group_ids",
    "grpo_advantage",
    "grpo_passk_advantage",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "needs_critic",
    "opo_advantage",
    "optimal_token_baseline_advantage",
    "policy_loss",
    "register_advantage_estimator",
    "register_policy_loss",
    "reinforce_loss",
    "reinforce_pp_advantage",
    "reinforce_pp_baseline_advantage",
    "remax_advantage",
    "reverse_linear_scan",
    "rloo_advantage",
    "tir_optimal_token_baseline_advantage",
    "value_loss",
]
