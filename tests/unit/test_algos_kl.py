"""KL estimators (values and gradients), KL controllers and the KL penalty in the reward."""

from __future__ import annotations

import dataclasses
import io
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcppo.algos import (
    KL_KINDS,
    AdaptiveKLController,
    FixedKLController,
    StepKLController,
    apply_kl_penalty,
    build_kl_controller,
    kl_penalty,
)

SETTINGS = settings(max_examples=50, deadline=None)
BASE_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
LOGP = st.floats(-40.0, 0.0, allow_nan=False, width=32)


def ref_kl(logp, ref, kind):
    """(value, d value / d logp) of one token's estimate, by hand."""
    d = logp - ref
    base = kind.rstrip("+")
    if base in ("kl", "k1"):
        value, grad = d, 1.0
    elif base == "abs":
        value, grad = abs(d), (d > 0) - (d < 0)
    elif base in ("mse", "k2"):
        value, grad = 0.5 * d * d, d
    else:
        k = min(max(-d, -20.0), 20.0)
        raw = math.exp(k) - k - 1
        value = min(max(raw, -10.0), 10.0)
        grad = (1 - math.exp(k)) if (abs(-d) < 20 and raw < 10) else 0.0
    if kind.endswith("+"):
        grad = d  # straight-through: k2's gradient
    return value, grad


@SETTINGS
@given(st.lists(st.tuples(LOGP, LOGP), min_size=1, max_size=12), st.sampled_from(KL_KINDS))
def test_kl_estimators_values_and_gradients(pairs, kind):
    logp = torch.tensor([[p for p, _ in pairs]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[r for _, r in pairs]], dtype=torch.float64)
    got = kl_penalty(logp, ref, kind)
    (grad,) = torch.autograd.grad(got.sum(), logp)
    for j, (p, r) in enumerate(pairs):
        value, g = ref_kl(p, r, kind)
        assert got[0, j].item() == pytest.approx(value, rel=1e-9, abs=1e-12)
        k = r - p
        if abs(abs(k) - 20) > 1e-9 and abs(math.exp(min(max(k, -20), 20)) - min(max(k, -20), 20) - 1 - 10) > 1e-9:
            assert grad[0, j].item() == pytest.approx(g, rel=1e-9, abs=1e-12)
    got32 = kl_penalty(logp.detach().float(), ref.float(), kind)
    assert got32.dtype == torch.float32
    assert torch.allclose(got32.double(), got.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", BASE_KINDS)
def test_kl_gradcheck_float64(kind):
    torch.manual_seed(0)
    ref = torch.randn(3, 6, dtype=torch.float64)
    # Differences away from 0 (|.| kink) and from the k3 clamps.
    diff = torch.tensor([-2.5, -0.7, -0.1, 0.2, 0.9, 1.7], dtype=torch.float64)
    logp = (ref + diff).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: kl_penalty(x, ref, kind), (logp,))
    assert torch.autograd.gradcheck(lambda r: kl_penalty(logp.detach(), r, kind), (ref.clone().requires_grad_(),))


def test_k3_clamps_far_outside_range():
    logp = torch.tensor([[0.0, -50.0, -5.0]], requires_grad=True)
    ref = torch.tensor([[-50.0, 0.0, -5.0]])
    got = kl_penalty(logp, ref, "k3")
    # ref - logp = -50 -> k = -20: exp(-20) + 20 - 1 > 10 -> clamped to 10; +50 -> exp(20) huge -> 10; equal -> 0.
    assert got.tolist() == [[10.0, 10.0, 0.0]]
    got.sum().backward()
    assert logp.grad.tolist() == [[0.0, 0.0, 0.0]]
    logp.grad = None
    kl_penalty(logp, ref, "k3+").sum().backward()
    assert logp.grad.tolist() == [[50.0, -50.0, 0.0]]


def test_unknown_kl_kind_lists_known_ones():
    x = torch.zeros(1, 2)
    for kind in ("full", "k4", "K3", "k3++"):
        known = r"known: kl, k1, abs, mse, k2, low_var_kl, k3, kl\+"
        with pytest.raises(ValueError, match=r"unknown KL estimator .*" + known):
            kl_penalty(x, x, kind)


@SETTINGS
@given(
    st.floats(0.0, 1.0),
    st.floats(1e-3, 1.0),
    st.integers(1, 10_000),
    st.integers(1, 512),
    st.floats(1e-4, 1.0),
)
def test_adaptive_controller_formula_and_direction(kl, target, horizon, n_steps, init):
    ctrl = AdaptiveKLController(init, target, horizon)
    kl_tensor = torch.tensor(kl)  # float32, as a KL metric arrives from the trainer
    value = ctrl.next_coef(ctrl.initial, kl_tensor, n_steps)
    # The formula on the value the controller received: float32 rounding of kl (~3e-8 relative) is multiplied by up
    # to n_steps / horizon = 512 and would exceed the tolerance (kl=0.7326483433087302, target=0.75, n_steps=17).
    kl = float(kl_tensor)
    error = min(max(kl / target - 1, -0.2), 0.2)
    assert value == pytest.approx(init * (1 + error * n_steps / horizon), rel=1e-6)
    if kl > target * (1 + 1e-6):
        assert value > init
    elif kl < target * (1 - 1e-6) and n_steps < horizon:
        assert value < init


def test_step_and_fixed_controllers():
    fixed = FixedKLController(0.05)
    assert fixed.next_coef(fixed.initial, torch.tensor(123.0), 64) == 0.05
    assert fixed.next_coef(0.2, torch.tensor(123.0), 64) == 0.2  # a coefficient the watchdog raised stays raised
    step = StepKLController(0.1, target_kl=0.05)
    value = step.next_coef(step.initial, 0.2, 1)
    assert value == pytest.approx(0.15)
    value = step.next_coef(step.next_coef(value, 0.01, 1), 0.01, 1)
    assert value == pytest.approx(0.1 / 1.5)
    value = step.next_coef(value, 0.05, 1)  # exactly at target: unchanged
    assert value == pytest.approx(0.1 / 1.5)
    for _ in range(40):
        value = step.next_coef(value, 1.0, 1)
    assert value == 10.0
    for _ in range(80):
        value = step.next_coef(value, 0.0, 1)
    assert value == 1e-4
    assert step.initial == 0.1  # a rule: nothing in it moved


def test_controllers_are_frozen_rules():
    ctrl = AdaptiveKLController(0.1, target_kl=0.05, horizon=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctrl.target_kl = 1.0  # type: ignore[misc]
    assert not hasattr(ctrl, "value")


def round_trip(state):
    buffer = io.BytesIO()
    torch.save({"kl_ctrl": state}, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)["kl_ctrl"]


@pytest.mark.parametrize(
    ("kind", "kwargs"),
    [
        ("fixed", {"kl_coef": 0.02}),
        ("adaptive", {"init_kl_coef": 0.02, "target_kl": 0.05, "horizon": 100}),
        ("step", {"init_kl_coef": 0.02, "target_kl": 0.05, "factor": 2.0, "min_coef": 1e-3, "max_coef": 1.0}),
    ],
)
def test_controllers_round_trip_through_weights_only_checkpoint(kind, kwargs):
    ctrl = build_kl_controller(kind, **kwargs)
    coef = ctrl.initial
    for kl in (0.2, 0.01, 0.3):
        coef = ctrl.next_coef(coef, torch.tensor(kl), 16)
    state = round_trip(ctrl.state_dict(coef))
    assert state["kind"] == kind and all(isinstance(v, str | float | int) for v in state.values())
    resumed = build_kl_controller(kind, **kwargs)
    resumed_coef = resumed.coef_from_state(state)
    assert resumed_coef == coef
    for kl in (0.07, 0.0, 0.5):
        coef = ctrl.next_coef(coef, kl, 8)
        resumed_coef = resumed.next_coef(resumed_coef, kl, 8)
        assert resumed_coef == coef
    other = "fixed" if kind != "fixed" else "adaptive"
    with pytest.raises(ValueError, match=f"state is for '{other}'"):
        resumed.coef_from_state({**state, "kind": other})
    with pytest.raises(ValueError, match="has no 'value'"):
        resumed.coef_from_state({"kind": kind})


def test_the_checkpoint_entry_keeps_the_format_of_the_controllers_that_held_their_value():
    # What the controllers' state_dict() wrote when each held its own ``value``: the same keys, read the same way.
    old = {"kind": "adaptive", "value": 0.0123, "target_kl": 0.05, "horizon": 100.0}
    ctrl = AdaptiveKLController(0.02, target_kl=0.05, horizon=100)
    assert ctrl.state_dict(0.0123) == old and ctrl.coef_from_state(round_trip(old)) == 0.0123
    assert FixedKLController(0.1).state_dict(0.3) == {"kind": "fixed", "value": 0.3}
    assert StepKLController(0.1, 0.05).state_dict(0.2) == {"kind": "step", "value": 0.2, "target_kl": 0.05,
                                                           "factor": 1.5, "min_coef": 1e-4, "max_coef": 10.0}


def test_build_kl_controller_fails_loudly():
    with pytest.raises(ValueError, match="unknown KL controller 'pid'; known: fixed, adaptive, step"):
        build_kl_controller("pid", kl_coef=0.1)
    with pytest.raises(ValueError, match="'adaptive'.*horizon"):
        build_kl_controller("adaptive", init_kl_coef=0.1, target_kl=0.1)
    with pytest.raises(ValueError, match="horizon must be a finite number > 0"):
        AdaptiveKLController(0.1, 0.1, 0)
    with pytest.raises(ValueError, match="target_kl must be"):
        AdaptiveKLController(0.1, 0.0, 10)
    with pytest.raises(ValueError, match="factor must be"):
        StepKLController(0.1, 0.1, factor=1.0)
    with pytest.raises(ValueError, match="outside"):
        StepKLController(20.0, 0.1)


def ref_apply(scores, old, ref, mask, kind, beta):
    rewards, per_seq = [], []
    for s_row, o_row, r_row, m_row in zip(scores, old, ref, mask):
        kl = [ref_kl(o, r, kind)[0] * m for o, r, m in zip(o_row, r_row, m_row)]
        rewards.append([s - beta * k for s, k in zip(s_row, kl)])
        per_seq.append(math.fsum(kl) / (sum(m_row) + 1e-8))
    return rewards, math.fsum(per_seq) / len(per_seq)


@SETTINGS
@given(
    st.integers(1, 5),
    st.integers(1, 6),
    st.lists(st.tuples(LOGP, LOGP, st.floats(-3, 3, width=32), st.booleans()), min_size=30, max_size=30),
    st.sampled_from(["kl", "abs", "k2", "k3", "k3+"]),
)
def test_apply_kl_penalty_matches_loop_and_feeds_the_controller(b, t, pool, kind):
    cells = [pool[(i * t + j) % 30] for i in range(b) for j in range(t)]
    old = [[cells[i * t + j][0] for j in range(t)] for i in range(b)]
    ref = [[cells[i * t + j][1] for j in range(t)] for i in range(b)]
    scores = [[cells[i * t + j][2] for j in range(t)] for i in range(b)]
    mask = [[float(cells[i * t + j][3]) for j in range(t)] for i in range(b)]
    ctrl = AdaptiveKLController(0.1, target_kl=0.5, horizon=1000)
    rewards, current = apply_kl_penalty(
        *(torch.tensor(x, dtype=torch.float64) for x in (scores, old, ref)), torch.tensor(mask), ctrl.initial, kind
    )
    exp_rewards, exp_kl = ref_apply(scores, old, ref, mask, kind, 0.1)
    assert current.dim() == 0 and current.item() == pytest.approx(exp_kl, rel=1e-9, abs=1e-12)
    for g_row, e_row in zip(rewards.tolist(), exp_rewards):
        assert g_row == pytest.approx(e_row, rel=1e-9, abs=1e-9)
    error = min(max(exp_kl / 0.5 - 1, -0.2), 0.2)
    assert ctrl.next_coef(0.1, current, b) == pytest.approx(0.1 * (1 + error * b / 1000), rel=1e-9)
