"""One signature for every advantage estimator, so the trainer never branches on the estimator's name.

    inputs = AdvantageInputs(token_level_rewards=r, response_mask=m, values=v, index=uids, gamma=1.0, lam=0.95)
    advantages, returns = compute_advantage("gae", inputs)

An estimator is a function ``(AdvantageInputs) -> (advantages, returns)`` registered with what it needs
(``needs_values``: a critic; ``needs_index``: group ids). The names and needs live in :mod:`hpcppo.estimators`
(torch-free, so the config compiler can validate a spec and plan a critic on a login node): the built-ins are
declared there, and :func:`register_advantage_estimator` declares a new one there as it registers its function.
Missing inputs and unknown names raise ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hpcppo import estimators
from hpcppo.estimators import needs_critic
from hpcppo.algos.advantages import (
    gae,
    gpg_advantage,
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

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageEstimator",
    "AdvantageInputs",
    "compute_advantage",
    "needs_critic",
    "register_advantage_estimator",
]


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything any estimator may use. Tensors are ``[batch, response_len]``; ``index`` has ``batch`` group ids.

    Attributes:
        token_level_rewards: rewards per token (KL penalty already applied if it is in the reward).
        response_mask: 1 on response tokens.
        values: critic values at rollout time (GAE).
        index: group ids, one per sample (GRPO, RLOO, REINFORCE++ baseline): list of hashables or int tensor.
        gamma: discount (GAE, REINFORCE++).
        lam: GAE lambda.
        norm_adv_by_std: GRPO divides by the group std (False: Dr. GRPO).
        epsilon: GRPO's std epsilon.
        reward_baselines: ``[batch]`` score of the greedy response to each sample's prompt (ReMax).
        old_log_probs: ``[batch, response_len]`` (the optimal token baselines' ``pi``).
        sum_pi_squared: ``[batch, response_len]`` the actor's ``sum_v pi_v^2`` per token (optimal token baselines).
        rollout_is_weights: ``[batch, response_len]`` rollout-correction IS weights (optimal token baselines).
    """

    token_level_rewards: torch.Tensor
    response_mask: torch.Tensor
    values: torch.Tensor | None = None
    index: Any = None
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std: bool = True
    epsilon: float = 1e-6
    reward_baselines: torch.Tensor | None = None
    old_log_probs: torch.Tensor | None = None
    sum_pi_squared: torch.Tensor | None = None
    rollout_is_weights: torch.Tensor | None = None


EstimatorFn = Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class AdvantageEstimator:
    """A registered estimator and the inputs it requires."""

    name: str
    fn: EstimatorFn
    needs_values: bool = False
    needs_index: bool = False
    needs_baseline: bool = False
    needs_sum_pi_squared: bool = False


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def _implements(name: str) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator registering the function of the declared estimator ``name`` (one function per name)."""

    def decorator(fn: EstimatorFn) -> EstimatorFn:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        needs = estimators.lookup(name)
        ADVANTAGE_ESTIMATORS[name] = AdvantageEstimator(name, fn, needs.needs_values, needs.needs_index,
                                                        needs.needs_baseline, needs.needs_sum_pi_squared)
        return fn

    return decorator


def register_advantage_estimator(
    name: str, *, needs_values: bool = False, needs_index: bool = False
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator registering ``fn(inputs) -> (advantages, returns)`` under ``name`` (names are unique) and declaring
    its needs in :mod:`hpcppo.estimators`, which makes ``algorithm.adv_estimator = "<name>"`` valid in a spec."""
    if name in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"advantage estimator {name!r} is already registered")
    estimators.declare(name, needs_values=needs_values, needs_index=needs_index)
    return _implements(name)


def _lookup(name: str) -> AdvantageEstimator:
    spec = ADVANTAGE_ESTIMATORS.get(name)
    if spec is None:
        estimators.lookup(name)  # unknown: the error lists the known names
        raise ValueError(f"advantage estimator {name!r} is declared in hpcppo.estimators but no function is "
                         f"registered for it (import the module that registers it)")
    return spec


def compute_advantage(name: str, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Run estimator ``name`` on ``inputs``; returns ``(advantages, returns)``, each ``[batch, response_len]``.

    Raises:
        ValueError: unknown name (listing the known ones), or an input the estimator needs is None.
    """
    spec = _lookup(name)
    if spec.needs_values and inputs.values is None:
        raise ValueError(f"advantage estimator {name!r} needs critic values: AdvantageInputs.values is None")
    if spec.needs_index and inputs.index is None:
        raise ValueError(f"advantage estimator {name!r} needs group ids: AdvantageInputs.index is None")
    if spec.needs_baseline and inputs.reward_baselines is None:
        raise ValueError(f"advantage estimator {name!r} needs the greedy responses' scores: "
                         f"AdvantageInputs.reward_baselines is None")
    if spec.needs_sum_pi_squared and (inputs.sum_pi_squared is None or inputs.old_log_probs is None):
        raise ValueError(f"advantage estimator {name!r} needs old_log_probs and sum_pi_squared: AdvantageInputs has "
                         f"None")
    return spec.fn(inputs)


@_implements("gae")
def _gae(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    assert inputs.values is not None  # checked by compute_advantage
    return gae(inputs.token_level_rewards, inputs.values, inputs.response_mask, inputs.gamma, inputs.lam)


@_implements("grpo")
def _grpo(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return grpo_advantage(
        inputs.token_level_rewards,
        inputs.response_mask,
        inputs.index,
        epsilon=inputs.epsilon,
        norm_adv_by_std=inputs.norm_adv_by_std,
    )


@_implements("rloo")
def _rloo(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return rloo_advantage(inputs.token_level_rewards, inputs.response_mask, inputs.index)


@_implements("reinforce_plus_plus")
def _reinforce_pp(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return reinforce_pp_advantage(inputs.token_level_rewards, inputs.response_mask, inputs.gamma)


@_implements("reinforce_plus_plus_baseline")
def _reinforce_pp_baseline(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return reinforce_pp_baseline_advantage(inputs.token_level_rewards, inputs.response_mask, inputs.index)


@_implements("remax")
def _remax(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    assert inputs.reward_baselines is not None  # checked by compute_advantage
    return remax_advantage(inputs.token_level_rewards, inputs.reward_baselines, inputs.response_mask)


@_implements("gpg")
def _gpg(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return gpg_advantage(inputs.token_level_rewards, inputs.response_mask, inputs.index)


@_implements("opo")
def _opo(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return opo_advantage(inputs.token_level_rewards, inputs.response_mask, inputs.index, epsilon=inputs.epsilon)


@_implements("grpo_passk")
def _grpo_passk(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return grpo_passk_advantage(inputs.token_level_rewards, inputs.response_mask, inputs.index, epsilon=inputs.epsilon,
                                norm_adv_by_std_in_grpo=inputs.norm_adv_by_std)


@_implements("optimal_token_baseline")
def _otb(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    assert inputs.old_log_probs is not None and inputs.sum_pi_squared is not None  # checked by compute_advantage
    return optimal_token_baseline_advantage(inputs.token_level_rewards, inputs.response_mask, inputs.index,
                                            inputs.old_log_probs, inputs.sum_pi_squared, inputs.rollout_is_weights)


@_implements("tir_optimal_token_baseline")
def _tir_otb(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    assert inputs.old_log_probs is not None and inputs.sum_pi_squared is not None  # checked by compute_advantage
    return tir_optimal_token_baseline_advantage(inputs.token_level_rewards, inputs.response_mask, inputs.index,
                                                inputs.old_log_probs, inputs.sum_pi_squared, inputs.rollout_is_weights)
