"""The advantage-estimator registry: one signature, loud failures, critic requirement."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hpcppo import estimators
from hpcppo.algos import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    compute_advantage,
    gae,
    grpo_advantage,
    needs_critic,
    register_advantage_estimator,
    reinforce_pp_advantage,
    reinforce_pp_baseline_advantage,
    rloo_advantage,
)

BUILTIN = {"gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"}


@pytest.fixture
def inputs():
    torch.manual_seed(0)
    r, v = torch.randn(6, 5), torch.randn(6, 5)
    m = (torch.rand(6, 5) > 0.3).float()
    m[:, 0] = 1
    return AdvantageInputs(r, m, values=v, index=["a", "a", "b", "b", "c", "a"], gamma=0.99, lam=0.9)


def test_builtin_names_and_critic_requirement():
    assert BUILTIN <= set(ADVANTAGE_ESTIMATORS)
    assert BUILTIN <= set(estimators.names())  # the torch-free declarations the config validates against
    assert {n for n in BUILTIN if needs_critic(n)} == {"gae"}
    assert {n for n in BUILTIN if estimators.needs_groups(n)} == {"grpo", "rloo", "reinforce_plus_plus_baseline"}
    for name in BUILTIN:  # one source of the needs: the registry's entries are the declarations
        spec, needs = ADVANTAGE_ESTIMATORS[name], estimators.lookup(name)
        assert (spec.needs_values, spec.needs_index) == (needs.needs_values, needs.needs_index)


def test_dispatch_equals_direct_calls(inputs):
    i = inputs
    direct = {
        "gae": gae(i.token_level_rewards, i.values, i.response_mask, 0.99, 0.9),
        "grpo": grpo_advantage(i.token_level_rewards, i.response_mask, i.index),
        "rloo": rloo_advantage(i.token_level_rewards, i.response_mask, i.index),
        "reinforce_plus_plus": reinforce_pp_advantage(i.token_level_rewards, i.response_mask, 0.99),
        "reinforce_plus_plus_baseline": reinforce_pp_baseline_advantage(
            i.token_level_rewards, i.response_mask, i.index
        ),
    }
    for name, (adv, ret) in direct.items():
        got_adv, got_ret = compute_advantage(name, inputs)
        assert torch.equal(got_adv, adv) and torch.equal(got_ret, ret), name
    dr_grpo, _ = compute_advantage("grpo", dataclasses.replace(inputs, norm_adv_by_std=False))
    expected, _ = grpo_advantage(i.token_level_rewards, i.response_mask, i.index, norm_adv_by_std=False)
    assert torch.equal(dr_grpo, expected)


def test_missing_inputs_and_unknown_names_fail_loudly(inputs):
    with pytest.raises(ValueError, match="'gae' needs critic values"):
        compute_advantage("gae", dataclasses.replace(inputs, values=None))
    for name in ("grpo", "rloo", "reinforce_plus_plus_baseline"):
        with pytest.raises(ValueError, match=f"'{name}' needs group ids"):
            compute_advantage(name, dataclasses.replace(inputs, index=None))
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'; known: gae, gpg, grpo, grpo_passk, opo, optimal_token_baseline, "
                                         "reinforce_plus_plus"):
        compute_advantage("ppo", inputs)
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        needs_critic("ppo2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.gamma = 0.5  # type: ignore[misc]


def test_register_custom_estimator(inputs):
    @register_advantage_estimator("test_algos_centered", needs_values=True)
    def centered(i: AdvantageInputs):
        adv = (i.token_level_rewards - i.values) * i.response_mask
        return adv, adv

    try:
        assert needs_critic("test_algos_centered")
        adv, _ = compute_advantage("test_algos_centered", inputs)
        assert torch.equal(adv, (inputs.token_level_rewards - inputs.values) * inputs.response_mask)
        with pytest.raises(ValueError, match="already registered"):
            register_advantage_estimator("test_algos_centered")(centered)
    finally:
        del ADVANTAGE_ESTIMATORS["test_algos_centered"]
        del estimators.ESTIMATORS["test_algos_centered"]
    with pytest.raises(ValueError, match="unknown advantage estimator 'test_algos_centered'"):
        needs_critic("test_algos_centered")


def test_declared_without_a_function_says_so(inputs):
    estimators.declare("test_algos_declared_only")
    try:
        with pytest.raises(ValueError, match="'test_algos_declared_only' is declared .* but no function is registered"):
            compute_advantage("test_algos_declared_only", inputs)
        with pytest.raises(ValueError, match="already declared"):
            estimators.declare("test_algos_declared_only", needs_values=True)
    finally:
        del estimators.ESTIMATORS["test_algos_declared_only"]
