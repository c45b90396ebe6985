"""algorithm.adv_estimator takes its names and needs from the estimator registry: a newly registered estimator is
selectable in a spec, and the plan trains a critic (or asks for several responses per prompt) as it declares."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcppo import estimators
from hpcppo.compiler import compile_config
from hpcppo.config import explain
from hpcppo.errors import ConfigError, ResolveError

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"


@pytest.fixture
def registered():
    """Register two estimators through the algos registry (what a user's module would do), then forget them."""
    import torch

    from hpcppo.algos import ADVANTAGE_ESTIMATORS, register_advantage_estimator

    @register_advantage_estimator("test_cfg_baseline", needs_values=True)
    def baseline(i):
        adv = (i.token_level_rewards - i.values) * i.response_mask
        return adv, adv

    @register_advantage_estimator("test_cfg_grouped", needs_index=True)
    def grouped(i):
        return torch.zeros_like(i.token_level_rewards), torch.zeros_like(i.token_level_rewards)

    yield
    for name in ("test_cfg_baseline", "test_cfg_grouped"):
        del ADVANTAGE_ESTIMATORS[name]
        del estimators.ESTIMATORS[name]


def compile_with(*overrides: str):
    return compile_config(ARITH, "local", list(overrides), check_paths=False)


def test_a_registered_estimator_is_selectable_and_plans_its_critic(registered):
    plan = compile_with("algorithm.adv_estimator=test_cfg_baseline").plan
    assert plan.needs_critic and plan.critic_ppo_epochs > 0
    grouped = compile_with("algorithm.adv_estimator=test_cfg_grouped", "rollout.n=4").plan
    assert not grouped.needs_critic and grouped.critic_ppo_epochs == 0
    with pytest.raises(ResolveError, match="'test_cfg_grouped' compares responses to the same prompt"):
        compile_with("algorithm.adv_estimator=test_cfg_grouped", "rollout.n=1")
    assert '"test_cfg_baseline", "test_cfg_grouped"' in explain("algorithm.adv_estimator")


def test_an_unregistered_name_is_refused_with_the_registered_ones(registered):
    with pytest.raises(ConfigError) as info:
        compile_with("algorithm.adv_estimator=test_cfg_groupd")
    assert str(info.value).endswith('"test_cfg_groupd" is not allowed; allowed values: "gae", "grpo", "rloo", '
                                    '"reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "gpg", '
                                    '"opo", "grpo_passk", "optimal_token_baseline", "tir_optimal_token_baseline", '
                                    '"test_cfg_baseline", "test_cfg_grouped" (did you mean \'test_cfg_grouped\'?)')


def test_declaring_needs_no_torch(tmp_path):
    """The config's view of the registry (hpcppo.estimators) is torch-free: a login node compiles specs."""
    import subprocess
    import sys

    code = ("import sys, hpcppo.compiler, hpcppo.estimators as e; e.declare('test_cfg_light');"
            "c = hpcppo.compiler.compile_config(sys.argv[1], 'local', ['algorithm.adv_estimator=test_cfg_light'],"
            " check_paths=False); print(c.plan.needs_critic, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(ARITH)], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.split() == ["False", "False"]
