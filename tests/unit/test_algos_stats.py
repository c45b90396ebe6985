"""Masked statistics and the reverse linear scan against plain Python loops (``math`` on floats)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcppo.algos import (
    explained_variance,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    reverse_linear_scan,
)

SETTINGS = settings(max_examples=50, deadline=None)
FLOATS = st.floats(-8.0, 8.0, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def masked_batch(draw, min_tokens: int = 0, max_b: int = 5, max_t: int = 10):
    """(values, mask) as nested Python lists, with at least ``min_tokens`` masked-in tokens."""
    b = draw(st.integers(1, max_b))
    t = draw(st.integers(1, max_t))
    if b * t < min_tokens:
        t = -(-min_tokens // b)
    values = draw(st.lists(st.lists(FLOATS, min_size=t, max_size=t), min_size=b, max_size=b))
    mask = draw(st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=b, max_size=b))
    for i in range(b):
        for j in range(t):
            if sum(map(sum, mask)) < min_tokens:
                mask[i][j] = True
    return values, [[float(x) for x in row] for row in mask]


def tensor(rows, dtype=torch.float32):
    return torch.tensor(rows, dtype=dtype)


def ref_stats(values, mask):
    """Mean, unbiased variance over the masked tokens, and the token count (Python floats)."""
    sel = [v for vr, mr in zip(values, mask) for v, m in zip(vr, mr) if m]
    n = len(sel)
    mean = sum(sel) / (n + 1e-8)
    var_biased = sum((x - mean) ** 2 for x in sel) / (n + 1e-8)
    return mean, var_biased * n / (n - 1) if n > 1 else float("nan"), n


@SETTINGS
@given(masked_batch())
def test_masked_sum_and_mean_match_loop(batch):
    values, mask = batch
    sel = [v for vr, mr in zip(values, mask) for v, m in zip(vr, mr) if m]
    v, m = tensor(values, torch.float64), tensor(mask)
    assert masked_sum(v, m).item() == pytest.approx(math.fsum(sel), abs=1e-9)
    assert masked_mean(v, m).item() == pytest.approx(math.fsum(sel) / (len(sel) + 1e-8), abs=1e-9)
    # Per-row means, axis=-1: an all-masked row gives 0 (verl's 1e-8 in the denominator).
    rows = masked_mean(v, m, axis=-1)
    for i, (vr, mr) in enumerate(zip(values, mask)):
        s = [x for x, k in zip(vr, mr) if k]
        assert rows[i].item() == pytest.approx(math.fsum(s) / (len(s) + 1e-8), abs=1e-9)


@SETTINGS
@given(masked_batch(min_tokens=2))
def test_masked_var_and_whiten_match_loop(batch):
    values, mask = batch
    mean, var, _ = ref_stats(values, mask)
    v, m = tensor(values, torch.float64), tensor(mask)
    assert masked_var(v, m).item() == pytest.approx(var, rel=1e-9, abs=1e-12)
    n = sum(map(sum, mask))
    assert masked_var(v, m, unbiased=False).item() == pytest.approx(var * (n - 1) / n, rel=1e-9, abs=1e-12)
    white = masked_whiten(v, m)
    kept = masked_whiten(v, m, shift_mean=False)
    for i, row in enumerate(values):
        for j, x in enumerate(row):
            expected = (x - mean) / math.sqrt(var + 1e-8)
            assert white[i, j].item() == pytest.approx(expected, rel=1e-9, abs=1e-9)
            assert kept[i, j].item() == pytest.approx(expected + mean, rel=1e-9, abs=1e-9)


@SETTINGS
@given(masked_batch(min_tokens=2))
def test_whiten_float32_within_tolerance_of_exact(batch):
    values, mask = batch
    mean, var, _ = ref_stats(values, mask)
    white = masked_whiten(tensor(values), tensor(mask))
    # float32 error of (x - mean) is ~eps * max|x|, divided by the std: scale the tolerance accordingly.
    scale = max(abs(x) for row in values for x in row) / math.sqrt(var + 1e-8)
    for i, row in enumerate(values):
        for j, x in enumerate(row):
            assert white[i, j].item() == pytest.approx((x - mean) / math.sqrt(var + 1e-8), abs=1e-5 * (1 + scale))


def test_values_outside_mask_never_leak():
    v = torch.tensor([[1.0, float("nan"), 3.0], [float("inf"), 5.0, -float("inf")]])
    m = torch.tensor([[1, 0, 1], [0, 1, 0]])
    assert masked_sum(v, m).item() == 9.0
    assert masked_mean(v, m).item() == pytest.approx(3.0)
    assert masked_var(v, m).item() == pytest.approx(4.0)
    white = masked_whiten(v, m)
    assert torch.isfinite(white[m.bool()]).all()


def test_masked_var_raises_like_verl_on_zero_or_one_token():
    v = torch.randn(2, 3)
    with pytest.raises(ValueError, match="no token"):
        masked_var(v, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="single token"):
        masked_var(v, torch.tensor([[0, 1, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="single token"):
        masked_whiten(v, torch.tensor([[0, 0, 0], [0, 0, 1]]))
    # The biased variance is defined for one token.
    assert masked_var(v, torch.tensor([[0, 1, 0], [0, 0, 0]]), unbiased=False).item() == 0.0


def test_bf16_mask_counts_exactly():
    # A bf16 sum of 4097 ones rounds to 4096: counts must be taken in float32.
    m = torch.ones(1, 4097, dtype=torch.bfloat16)
    v = torch.zeros(1, 4097)
    v[0, 0] = 4097.0
    assert masked_mean(v, m).item() == pytest.approx(1.0, rel=1e-6)


@SETTINGS
@given(masked_batch(min_tokens=2), st.lists(FLOATS, min_size=50, max_size=50))
def test_explained_variance_matches_loop(batch, noise):
    returns, mask = batch
    values = [[r + noise[(i * 7 + j) % 50] for j, r in enumerate(row)] for i, row in enumerate(returns)]
    sel_r = [r for rr, mr in zip(returns, mask) for r, m in zip(rr, mr) if m]
    sel_d = [r - v for rr, vr, mr in zip(returns, values, mask) for r, v, m in zip(rr, vr, mr) if m]

    def var(xs):
        mu = sum(xs) / len(xs)
        return sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)

    expected = 1 - var(sel_d) / (var(sel_r) + 1e-5)
    got = explained_variance(tensor(values, torch.float64), tensor(returns, torch.float64), tensor(mask)).item()
    assert got == pytest.approx(expected, rel=1e-7, abs=1e-7)


def test_explained_variance_perfect_and_degenerate():
    r = torch.randn(3, 5)
    m = torch.ones(3, 5)
    assert explained_variance(r, r, m).item() == pytest.approx(1.0, abs=1e-5)
    assert explained_variance(torch.zeros(3, 5), r, m).item() == pytest.approx(0.0, abs=1e-4)
    # A metric never raises: one token gives NaN, like torch.var.
    one = torch.zeros(3, 5)
    one[0, 0] = 1
    assert math.isnan(explained_variance(r, r, one).item())


def ref_scan(xs, cs):
    out, y = [0.0] * len(xs), 0.0
    for t in reversed(range(len(xs))):
        y = xs[t] + cs[t] * y
        out[t] = y
    return out


@SETTINGS
@given(
    st.integers(1, 70),
    st.data(),
)
def test_reverse_linear_scan_matches_sequential_loop(length, data):
    xs = data.draw(st.lists(FLOATS, min_size=length, max_size=length))
    coefs = st.sampled_from([0.0, 1.0, 0.5, 0.99, -0.7]) | st.floats(0, 1)
    cs = data.draw(st.lists(coefs, min_size=length, max_size=length))
    got = reverse_linear_scan(torch.tensor([xs], dtype=torch.float64), torch.tensor([cs], dtype=torch.float64))
    assert got[0].tolist() == pytest.approx(ref_scan(xs, cs), rel=1e-9, abs=1e-9)
    const = data.draw(st.sampled_from([0.0, 1.0, 0.95, 0.3]))
    got_const = reverse_linear_scan(torch.tensor([xs], dtype=torch.float64), const)
    assert got_const[0].tolist() == pytest.approx(ref_scan(xs, [const] * length), rel=1e-9, abs=1e-9)


def test_reverse_linear_scan_leading_dims_and_broadcast_coef():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 37, dtype=torch.float64)
    coef = torch.rand(37, dtype=torch.float64)  # one coefficient row shared by every sequence
    got = reverse_linear_scan(x, coef)
    assert got.shape == x.shape
    for i in range(2):
        for j in range(3):
            assert got[i, j].tolist() == pytest.approx(ref_scan(x[i, j].tolist(), coef.tolist()), rel=1e-12)
