"""Policy/value/entropy losses and loss aggregation against per-token Python loops; gradients via gradcheck."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcppo.algos import (
    LOSS_AGG_MODES,
    GlobalBatchInfo,
    agg_loss,
    entropy_from_logits,
    entropy_loss,
    policy_loss,
    value_loss,
)

SETTINGS = settings(max_examples=50, deadline=None)


def fl(lo, hi):
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def token_batch(draw, n_fields: int, lo: float = -5.0, hi: float = 5.0, max_b: int = 5, max_t: int = 8):
    """``n_fields`` [B, T] float matrices plus a mask (may have all-masked rows or be all masked)."""
    b = draw(st.integers(1, max_b))
    t = draw(st.integers(1, max_t))
    fields = [
        draw(st.lists(st.lists(fl(lo, hi), min_size=t, max_size=t), min_size=b, max_size=b)) for _ in range(n_fields)
    ]
    mask = draw(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=t, max_size=t), min_size=b, max_size=b))
    return fields, mask


def ref_agg(loss, mask, mode):
    """verl's aggregation on nested lists; empty denominators give 0 (our documented deviation from 0/0)."""
    rows = [(math.fsum(x * m for x, m in zip(lr, mr)), sum(mr)) for lr, mr in zip(loss, mask)]
    if mode == "token-mean":
        total = sum(n for _, n in rows)
        return math.fsum(s for s, _ in rows) / max(total, 1)
    if mode == "seq-mean-token-sum-norm":
        return math.fsum(s for s, _ in rows) / len(mask[0])
    per_seq = [s if mode == "seq-mean-token-sum" else s / (n + 1e-8) for s, n in rows if n > 0]
    return math.fsum(per_seq) / max(len(per_seq), 1)


def ref_masked_mean(x, mask):
    return math.fsum(v * m for vr, mr in zip(x, mask) for v, m in zip(vr, mr)) / (sum(map(sum, mask)) + 1e-8)


def ref_policy(old, new, adv, mask, low, high, c, mode):
    per_token, clipped, lower, kl = [], [], [], []
    for o_row, n_row, a_row in zip(old, new, adv):
        lt, ct, lwt, kt = [], [], [], []
        for o, n, a in zip(o_row, n_row, a_row):
            log_ratio = min(max(n - o, -20.0), 20.0)
            ratio = math.exp(log_ratio)
            l1 = -a * ratio
            l2 = -a * min(max(ratio, 1 - low), 1 + high)
            lc = max(l1, l2)
            l3 = -a * c
            lt.append(min(l3, lc) if a < 0 else lc)
            ct.append(float(l2 > l1))
            lwt.append(float(lc > l3 and a < 0))
            kt.append(-log_ratio)
        per_token.append(lt)
        clipped.append(ct)
        lower.append(lwt)
        kl.append(kt)
    return {
        "loss": ref_agg(per_token, mask, mode),
        "pg_clipfrac": ref_masked_mean(clipped, mask),
        "pg_clipfrac_lower": ref_masked_mean(lower, mask),
        "ppo_kl": ref_masked_mean(kl, mask),
    }


CLIPS = st.tuples(
    st.sampled_from([0.2, 0.1, None]),  # clip_ratio
    st.sampled_from([None, 0.1, 0.2, 0.3]),  # low
    st.sampled_from([None, 0.2, 0.28, 4.0]),  # high
    st.sampled_from([1.0 + 1e-6, 1.5, 3.0, 1e6]),  # c
)


@SETTINGS
@given(token_batch(3, lo=-30.0, hi=0.0), CLIPS, st.sampled_from(LOSS_AGG_MODES))
def test_policy_loss_matches_loop(batch, clips, mode):
    (old, new, adv), mask = batch
    adv = [[a / 12.0 + 1.25 for a in row] for row in adv]  # drawn in [-30, 0]: map to [-1.25, 1.25]
    clip_ratio, low, high, c = clips
    if clip_ratio is None and (low is None or high is None):
        with pytest.raises(ValueError, match="clip_ratio_low and clip_ratio_high"):
            policy_loss(*(torch.tensor(x) for x in (old, new, adv, mask)), clip_ratio, low, high, c, mode)
        return
    low_eff = clip_ratio if low is None else low
    high_eff = clip_ratio if high is None else high
    expected = ref_policy(old, new, adv, mask, low_eff, high_eff, c, mode)
    args64 = (torch.tensor(x, dtype=torch.float64) for x in (old, new, adv, mask))
    out = policy_loss(*args64, clip_ratio, low, high, c, mode)
    for key, value in expected.items():
        assert out[key].item() == pytest.approx(value, rel=1e-9, abs=1e-9), key
    out32 = policy_loss(*(torch.tensor(x) for x in (old, new, adv, mask)), clip_ratio, low, high, c, mode)
    assert out32["loss"].dtype == torch.float32
    assert out32["loss"].item() == pytest.approx(expected["loss"], rel=1e-5, abs=1e-5)


@SETTINGS
@given(
    fl(-40.0, 40.0),
    fl(-5.0, -0.125),
    st.sampled_from([1.0 + 1e-6, 1.01, 3.0, 10.0, 1e6]),
    st.sampled_from([0.2, 0.0]),
)
def test_dual_clip_bounds_negative_advantage_loss(log_ratio, adv, c, clip):
    # One token: the aggregated loss is the token's loss.
    old = torch.zeros(1, 1, dtype=torch.float64)
    new = torch.full((1, 1), log_ratio, dtype=torch.float64)
    out = policy_loss(old, new, torch.full((1, 1), adv, dtype=torch.float64), torch.ones(1, 1), clip, clip_ratio_c=c)
    assert out["loss"].item() <= c * abs(adv) * (1 + 1e-12)
    ratio = math.exp(min(max(log_ratio, -20), 20))
    if abs(max(ratio, 1 - clip) - c) > 1e-9 * c:  # exactly at the bound, rounding may decide either way
        assert out["pg_clipfrac_lower"].item() == pytest.approx(float(max(ratio, 1 - clip) > c))


def test_policy_loss_rejects_bad_arguments():
    x = torch.zeros(2, 3)
    for c in (1.0, 0.5, -3.0):
        with pytest.raises(ValueError, match="clip_ratio_c must be > 1.0"):
            policy_loss(x, x, x, x, 0.2, clip_ratio_c=c)
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'mean'.*token-mean"):
        policy_loss(x, x, x, x, 0.2, loss_agg_mode="mean")


def test_policy_loss_graph_metrics_and_bf16():
    torch.manual_seed(0)
    old = torch.randn(4, 6).to(torch.bfloat16)
    new = (old.float() + 0.3 * torch.randn(4, 6)).to(torch.bfloat16).requires_grad_()
    adv, mask = torch.randn(4, 6), (torch.rand(4, 6) > 0.3).float()
    out = policy_loss(old, new, adv, mask, 0.2)
    assert out["loss"].dtype == torch.float32 and out["loss"].requires_grad
    for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
        assert not out[key].requires_grad and out[key].dim() == 0
    out["loss"].backward()
    assert new.grad is not None and new.grad.dtype == torch.bfloat16
    assert torch.all(new.grad[mask == 0] == 0)
    ref = policy_loss(old.float(), new.detach().float(), adv, mask, 0.2)
    assert out["loss"].item() == pytest.approx(ref["loss"].item(), rel=1e-6)


def test_policy_loss_gradcheck_float64():
    torch.manual_seed(1)
    b, t = 3, 7
    old = torch.randn(b, t, dtype=torch.float64)
    # Log-ratios away from every kink (1 ± clip, the dual bound 3, the ±20 clamp) so finite differences are valid;
    # two tokens sit far beyond the clamp, where the gradient is exactly zero.
    log_ratio = torch.tensor([-2.0, -0.5, -0.05, 0.0, 0.05, 0.4, 1.5]).repeat(b, 1).to(torch.float64)
    log_ratio[0, 0], log_ratio[1, 6] = -35.0, 27.0
    new = (old + log_ratio).requires_grad_()
    adv = torch.randn(b, t, dtype=torch.float64)
    adv[adv.abs() < 0.1] = 0.5
    mask = torch.ones(b, t)
    mask[2, 5:] = 0
    for mode in LOSS_AGG_MODES:
        assert torch.autograd.gradcheck(
            lambda n, m=mode: policy_loss(old, n, adv, mask, 0.2, clip_ratio_high=0.28, loss_agg_mode=m)["loss"],
            (new,),
        )
    out = policy_loss(old, new, adv, mask, 0.2)
    (grad,) = torch.autograd.grad(out["loss"], new)
    assert grad[0, 0] == 0 and grad[1, 6] == 0


def ref_value(v, v_old, ret, mask, eps, mode):
    per_token, clipped, unclipped = [], [], []
    for vr, orow, rr in zip(v, v_old, ret):
        lt, ct, ut = [], [], []
        for x, o, r in zip(vr, orow, rr):
            x_clip = max(min(x, o + eps), o - eps)
            l1, l2 = (x - r) ** 2, (x_clip - r) ** 2
            lt.append(max(l1, l2))
            ct.append(float(l2 > l1))
            ut.append(l1)
        per_token.append(lt)
        clipped.append(ct)
        unclipped.append(ut)
    return 0.5 * ref_agg(per_token, mask, mode), ref_masked_mean(clipped, mask), 0.5 * ref_agg(unclipped, mask, mode)


@SETTINGS
@given(token_batch(3), st.sampled_from([0.5, 0.2, 10.0]), st.sampled_from(LOSS_AGG_MODES))
def test_value_loss_matches_loop_and_never_below_unclipped(batch, eps, mode):
    (v, v_old, ret), mask = batch
    loss, clipfrac, unclipped = ref_value(v, v_old, ret, mask, eps, mode)
    out = value_loss(*(torch.tensor(x, dtype=torch.float64) for x in (v, v_old, ret, mask)), eps, mode)
    assert out["loss"].item() == pytest.approx(loss, rel=1e-9, abs=1e-9)
    assert out["vf_clipfrac"].item() == pytest.approx(clipfrac, rel=1e-9, abs=1e-12)
    plain = 0.5 * agg_loss((torch.tensor(v) - torch.tensor(ret)) ** 2, torch.tensor(mask), mode)
    out32 = value_loss(*(torch.tensor(x) for x in (v, v_old, ret, mask)), eps, mode)
    assert out32["loss"].item() >= plain.item() - 1e-6 * (1 + abs(plain.item()))
    assert unclipped <= loss + 1e-12
    assert out32["loss"].item() == pytest.approx(loss, rel=1e-5, abs=1e-5)


def test_value_loss_gradcheck_and_metrics():
    torch.manual_seed(2)
    v_old = torch.randn(3, 5, dtype=torch.float64)
    # Offsets from the old values away from the clip edges (±0.5).
    v = (v_old + torch.tensor([-1.3, -0.2, 0.1, 0.7, 2.0], dtype=torch.float64)).requires_grad_()
    ret = torch.randn(3, 5, dtype=torch.float64)
    mask = torch.ones(3, 5)
    mask[1, :] = 0  # an all-masked row
    for mode in LOSS_AGG_MODES:
        assert torch.autograd.gradcheck(
            lambda x, m=mode: value_loss(x, v_old, ret, mask, 0.5, loss_agg_mode=m)["loss"], (v,)
        )
    out = value_loss(v, v_old, ret, mask, 0.5)
    assert out["loss"].requires_grad and not out["vf_clipfrac"].requires_grad


@SETTINGS
@given(token_batch(1), st.sampled_from(LOSS_AGG_MODES))
def test_agg_loss_matches_loop(batch, mode):
    (loss,), mask = batch
    got = agg_loss(torch.tensor(loss, dtype=torch.float64), torch.tensor(mask), mode)
    assert got.item() == pytest.approx(ref_agg(loss, mask, mode), rel=1e-9, abs=1e-9)


def test_agg_loss_known_values_and_empty_rows():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(27 / 5)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx((3 + 24) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 8) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(27 / 3)
    empty = torch.zeros(3, 3)
    for mode in LOSS_AGG_MODES:
        assert agg_loss(loss, empty, mode).item() == 0.0
    with pytest.raises(ValueError, match="known modes: token-mean, seq-mean-token-sum"):
        agg_loss(loss, mask, "sum")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_global_batch_info_makes_micro_batches_add_up(mode):
    torch.manual_seed(3)
    loss = torch.randn(6, 5, dtype=torch.float64)
    mask = (torch.rand(6, 5) > 0.4).double()
    mask[4] = 0
    full = agg_loss(loss, mask, mode)
    info = GlobalBatchInfo(
        batch_num_tokens=mask.sum(), global_batch_size=int((mask.sum(-1) > 0).sum()), loss_scale_factor=5
    )
    parts = sum(agg_loss(loss[s], mask[s], mode, batch_info=info) for s in (slice(0, 2), slice(2, 6)))
    assert parts.item() == pytest.approx(full.item(), rel=1e-12)
    doubled = agg_loss(loss, mask, mode, batch_info=GlobalBatchInfo(dp_size=2, loss_scale_factor=5))
    factor = 1 if mode == "seq-mean-token-sum-norm" else 2
    assert doubled.item() == pytest.approx(factor * full.item(), rel=1e-12)


def ref_entropy(row):
    mx = max(row)
    exps = [math.exp(z - mx) for z in row]
    total = math.fsum(exps)
    return -math.fsum(e / total * math.log(e / total) for e in exps if e > 0)


@SETTINGS
@given(
    st.integers(1, 3),
    st.integers(1, 4),
    st.lists(fl(-30.0, 30.0), min_size=36, max_size=36),
    st.integers(2, 3),
)
def test_entropy_matches_loop(b, t, pool, vocab):
    logits = torch.tensor(pool[: b * t * vocab], dtype=torch.float64).reshape(b, t, vocab)
    got = entropy_from_logits(logits)
    for i in range(b):
        for j in range(t):
            assert got[i, j].item() == pytest.approx(ref_entropy(logits[i, j].tolist()), abs=1e-9)
    mask = torch.ones(b, t)
    mask[0, 0] = 0
    expected = ref_agg(got.tolist(), mask.tolist(), "token-mean")
    assert entropy_loss(logits, mask).item() == pytest.approx(expected, abs=1e-9)


def test_entropy_gradcheck_uniform_and_bf16():
    torch.manual_seed(4)
    logits = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(entropy_from_logits, (logits,))
    assert entropy_from_logits(torch.zeros(1, 1, 8)).item() == pytest.approx(math.log(8), rel=1e-6)
    bf = (torch.randn(2, 3, 11) * 4).to(torch.bfloat16)
    got = entropy_from_logits(bf)
    assert got.dtype == torch.float32
    assert torch.allclose(got, entropy_from_logits(bf.float()), atol=1e-6)
