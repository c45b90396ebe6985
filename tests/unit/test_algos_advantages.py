"""Advantage estimators against independent per-token Python loops (floats and ``math``, no torch)."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcppo.algos import (
    gae,
    group_ids,
    grpo_advantage,
    reinforce_pp_advantage,
    reinforce_pp_baseline_advantage,
    rloo_advantage,
)

SETTINGS = settings(max_examples=50, deadline=None)
FLOATS = st.floats(-5.0, 5.0, allow_nan=False, allow_infinity=False, width=32)
LABELS = st.sampled_from(["p0", "p1", "p2", "p3"])


@st.composite
def rollout(draw, min_tokens: int = 0):
    """rewards, values, mask (nested lists) and group labels; mask styles: random gaps, EOS prefix, multi-turn."""
    b = draw(st.integers(1, 6))
    t = draw(st.integers(1, 12))
    if b * t < min_tokens:
        t = -(-min_tokens // b)
    rewards = draw(st.lists(st.lists(FLOATS, min_size=t, max_size=t), min_size=b, max_size=b))
    values = draw(st.lists(st.lists(FLOATS, min_size=t, max_size=t), min_size=b, max_size=b))
    style = draw(st.sampled_from(["random", "eos", "turns"]))
    if style == "random":
        mask = draw(st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=b, max_size=b))
    elif style == "eos":
        lengths = draw(st.lists(st.integers(0, t), min_size=b, max_size=b))
        mask = [[j < n for j in range(t)] for n in lengths]
    else:  # two assistant turns separated by observation tokens
        mask = []
        for _ in range(b):
            a, gap, c = sorted(draw(st.lists(st.integers(0, t), min_size=3, max_size=3)))
            mask.append([j < a or gap <= j < c for j in range(t)])
    mask = [[float(x) for x in row] for row in mask]
    tokens = sum(map(sum, mask))
    for i in range(b):
        for j in range(t):
            if tokens < min_tokens and not mask[i][j]:
                mask[i][j] = 1.0
                tokens += 1
    labels = draw(st.lists(LABELS, min_size=b, max_size=b))
    return rewards, values, mask, labels


def tensors(*rows, dtype):
    return [torch.tensor(r, dtype=dtype) for r in rows]


def ref_whiten(x, mask):
    sel = [v for vr, mr in zip(x, mask) for v, m in zip(vr, mr) if m]
    n = len(sel)
    mean = sum(sel) / (n + 1e-8)
    var = sum((v - mean) ** 2 for v in sel) / (n + 1e-8) * n / (n - 1)
    inv = 1 / math.sqrt(var + 1e-8)
    # Condition number of whitening: float32 rounding of values/mean (~eps * max|x|) is amplified by 1/std.
    scale = max(abs(v) for row in x for v in row) * inv
    return [[(v - mean) * inv for v in row] for row in x], scale


def ref_gae(rewards, values, mask, gamma, lam):
    raw = []
    for r, v, m in zip(rewards, values, mask):
        out, next_value, last = [0.0] * len(r), 0.0, 0.0
        for t in reversed(range(len(r))):
            if m[t]:
                last = r[t] + gamma * next_value - v[t] + gamma * lam * last
                next_value = v[t]
            out[t] = last
        raw.append(out)
    returns = [[a + v for a, v in zip(ar, vr)] for ar, vr in zip(raw, values)]
    white, scale = ref_whiten(raw, mask)
    return white, returns, scale


def assert_rows(got, expected, abs_tol):
    assert len(got) == len(expected)
    for g_row, e_row in zip(got.tolist(), expected):
        assert g_row == pytest.approx(e_row, rel=0, abs=abs_tol)


@SETTINGS
@given(rollout(min_tokens=2), st.sampled_from([1.0, 0.99, 0.5, 0.0]), st.sampled_from([1.0, 0.95, 0.3, 0.0]))
def test_gae_matches_loop(batch, gamma, lam):
    rewards, values, mask, _ = batch
    adv_ref, ret_ref, scale = ref_gae(rewards, values, mask, gamma, lam)
    adv, ret = gae(*tensors(rewards, values, mask, dtype=torch.float64), gamma, lam)
    assert_rows(adv, adv_ref, 1e-9 * (1 + scale))
    assert_rows(ret, ret_ref, 1e-9)
    adv32, ret32 = gae(*tensors(rewards, values, mask, dtype=torch.float32), gamma, lam)
    assert adv32.dtype == ret32.dtype == torch.float32
    # float32 tolerance: 1e-5 relative to the largest partial sum a row can reach. The raw advantages (returns -
    # values) carry that same error, and whitening multiplies it by 1/std: without the partial-sum term hypothesis
    # found a one-row batch whose whitened advantages were off by 6.7e-5 against a 1.1e-5 bound.
    bound = 1 + max(sum(abs(x) for x in r) + 2 * sum(abs(x) for x in v) for r, v in zip(rewards, values))
    assert_rows(ret32, ret_ref, 1e-5 * bound)
    raw = [[a - v for a, v in zip(ar, vr)] for ar, vr in zip(ret_ref, values)]
    inv_std = scale / (max(abs(x) for row in raw for x in row) or 1.0)  # scale = max|raw| / std (ref_whiten)
    assert_rows(adv32, adv_ref, 1e-5 * (1 + scale + bound * inv_std))


def test_gae_multi_turn_hand_computed():
    # Token 1 is an observation: its value (9) and reward (100) must be skipped; its advantage carries token 2's.
    r = torch.tensor([[0.0, 100.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 9.0, 0.2, 0.4]])
    m = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    _, ret = gae(r, v, m, gamma=0.9, lam=0.8)
    raw = [0.10624, 0.592, 0.592, 0.6]
    assert (ret - v)[0].tolist() == pytest.approx(raw, abs=1e-6)


def test_gae_ignores_garbage_outside_mask():
    torch.manual_seed(0)
    r, v = torch.randn(3, 7), torch.randn(3, 7)
    m = (torch.rand(3, 7) > 0.4).float()
    m[0, :2] = 1
    adv, _ = gae(r, v, m, 1.0, 0.95)
    r2, v2 = r.clone(), v.clone()
    r2[m == 0] = 1e6
    v2[m == 0] = float("nan")
    adv2, ret2 = gae(r2, v2, m, 1.0, 0.95)
    assert torch.equal(adv, adv2)
    assert torch.isfinite(ret2[m.bool()]).all()


def test_gae_raises_like_verl_on_tiny_masks():
    r, v = torch.randn(2, 4), torch.randn(2, 4)
    one = torch.zeros(2, 4)
    one[1, 2] = 1
    with pytest.raises(ValueError, match="single token"):
        gae(r, v, one, 1.0, 1.0)
    with pytest.raises(ValueError, match="no token"):
        gae(r, v, torch.zeros(2, 4), 1.0, 1.0)
    with pytest.raises(ValueError, match="shape"):
        gae(r, v[:, :3], torch.ones(2, 4), 1.0, 1.0)


def test_gae_long_sequence_float32_close_to_float64():
    torch.manual_seed(1)
    r, v = torch.randn(8, 1500) * 0.1, torch.randn(8, 1500)
    m = (torch.rand(8, 1500) > 0.2).float()
    a64, r64 = gae(r.double(), v.double(), m, 0.999, 0.97)
    a32, r32 = gae(r, v, m, 0.999, 0.97)
    assert torch.allclose(a32.double(), a64, atol=1e-5, rtol=1e-5)
    assert torch.allclose(r32.double(), r64, atol=1e-4, rtol=1e-5)


def ref_groups(labels):
    groups: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        groups.setdefault(label, []).append(i)
    return groups


def ref_grpo(rewards, mask, labels, eps, norm):
    scores = [math.fsum(row) for row in rewards]
    adv = [0.0] * len(scores)
    for members in ref_groups(labels).values():
        s = [scores[i] for i in members]
        mean, std = (statistics.fmean(s), statistics.stdev(s)) if len(s) > 1 else (0.0, 1.0)
        for i in members:
            adv[i] = (scores[i] - mean) / (std + eps) if norm else scores[i] - mean
    return [[a * m for m in row] for a, row in zip(adv, mask)]


def ref_rloo(rewards, mask, labels):
    scores = [math.fsum(row) for row in rewards]
    adv = list(scores)
    for members in ref_groups(labels).values():
        n = len(members)
        if n > 1:
            mean = statistics.fmean(scores[i] for i in members)
            for i in members:
                adv[i] = (scores[i] - mean) * n / (n - 1)
    return [[a * m for m in row] for a, row in zip(adv, mask)]


def ref_rpp_baseline(rewards, mask, labels):
    scores = [math.fsum(row) for row in rewards]
    centered = list(scores)
    for members in ref_groups(labels).values():
        if len(members) > 1:
            mean = statistics.fmean(scores[i] for i in members)
            for i in members:
                centered[i] = scores[i] - mean
    tiled = [[c * m for m in row] for c, row in zip(centered, mask)]
    white, scale = ref_whiten(tiled, mask)
    return [[w * m for w, m in zip(wr, mr)] for wr, mr in zip(white, mask)], scale


def ref_rpp(rewards, mask, gamma):
    returns = []
    for r, m in zip(rewards, mask):
        out, running = [0.0] * len(r), 0.0
        for t in reversed(range(len(r))):
            running = r[t] + gamma * running
            out[t] = running
            running *= m[t]  # reset after a token outside the response
        returns.append(out)
    white, scale = ref_whiten(returns, mask)
    return [[w * m for w, m in zip(wr, mr)] for wr, mr in zip(white, mask)], returns, scale


def as_index(labels, kind):
    if kind == "list":
        return labels
    if kind == "numpy":
        return np.array(labels, dtype=object)
    # Sparse, non-contiguous integer ids, as a tensor.
    return torch.tensor([1_000_003 * (int(label[1:]) + 1) - 7 for label in labels])


@SETTINGS
@given(rollout(), st.booleans(), st.sampled_from(["list", "numpy", "tensor"]))
def test_grpo_and_rloo_match_loops(batch, norm, index_kind):
    rewards, _, mask, labels = batch
    index = as_index(labels, index_kind)
    r64, m64 = tensors(rewards, mask, dtype=torch.float64)
    adv, ret = grpo_advantage(r64, m64, index, epsilon=1e-6, norm_adv_by_std=norm)
    assert torch.equal(adv, ret)
    assert_rows(adv, ref_grpo(rewards, mask, labels, 1e-6, norm), 1e-6)
    adv, ret = rloo_advantage(r64, m64, index)
    assert torch.equal(adv, ret)
    assert_rows(adv, ref_rloo(rewards, mask, labels), 1e-9)
    # float32: loose only where the group std is tiny (the division by std + 1e-6 amplifies rounding of the sum).
    adv32, _ = grpo_advantage(*tensors(rewards, mask, dtype=torch.float32), index, norm_adv_by_std=False)
    assert_rows(adv32, ref_grpo(rewards, mask, labels, 1e-6, False), 1e-5 * (1 + 12 * 5))


@SETTINGS
@given(rollout(min_tokens=2), st.sampled_from(["list", "tensor"]), st.sampled_from([1.0, 0.9, 0.0]))
def test_reinforce_pp_variants_match_loops(batch, index_kind, gamma):
    rewards, _, mask, labels = batch
    r64, m64 = tensors(rewards, mask, dtype=torch.float64)
    expected, scale = ref_rpp_baseline(rewards, mask, labels)
    adv, ret = reinforce_pp_baseline_advantage(r64, m64, as_index(labels, index_kind))
    assert torch.equal(adv, ret)
    assert_rows(adv, expected, 1e-9 * (1 + scale))
    adv_ref, ret_ref, scale = ref_rpp(rewards, mask, gamma)
    adv, ret = reinforce_pp_advantage(r64, m64, gamma)
    assert_rows(ret, ret_ref, 1e-9)
    assert_rows(adv, adv_ref, 1e-9 * (1 + scale))


def test_grpo_known_values_and_groups_of_one():
    r = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 3.0]])
    m = torch.ones(3, 2)
    adv, _ = grpo_advantage(r, m, ["a", "a", "solo"])
    s = 1 / math.sqrt(2)  # std of {1, 0} is sqrt(0.5)
    assert adv[:, 0].tolist() == pytest.approx([0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 3.0 / (1 + 1e-6)], rel=1e-6)
    # RLOO: (s - mean) * n / (n - 1); a group of one keeps its score (verl leaves it untouched).
    adv, _ = rloo_advantage(r, m, ["a", "a", "solo"])
    assert adv[:, 1].tolist() == pytest.approx([1.0, -1.0, 3.0])


def test_group_advantages_respect_mask_and_batch_of_one():
    r = torch.tensor([[0.0, 0.0, 2.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    adv, _ = grpo_advantage(r, m, ["x"])
    assert adv[0].tolist() == pytest.approx([2.0 / (1 + 1e-6), 2.0 / (1 + 1e-6), 0.0])
    adv, _ = rloo_advantage(r, m, torch.tensor([4]))
    assert adv.tolist() == [[2.0, 2.0, 0.0]]


def test_group_ids_dense_and_consistent():
    labels = ["b", "a", "b", "c", "a"]
    ids = group_ids(labels, 5, torch.device("cpu")).tolist()
    assert ids == [0, 1, 0, 2, 1]
    t_ids = group_ids(torch.tensor([90, -3, 90, 10**12, -3]), 5, torch.device("cpu")).tolist()
    assert len(set(t_ids)) == 3 and max(t_ids) == 2
    assert [t_ids[i] == t_ids[j] for i in range(5) for j in range(5)] == [
        ids[i] == ids[j] for i in range(5) for j in range(5)
    ]


def test_group_ids_reject_bad_index():
    with pytest.raises(ValueError, match="expected 3 group ids"):
        group_ids(["a", "b"], 3, torch.device("cpu"))
    with pytest.raises(ValueError, match="expected 2 group ids"):
        group_ids(torch.tensor([1, 2, 3]), 2, torch.device("cpu"))
    with pytest.raises(ValueError, match="integers"):
        group_ids(torch.tensor([0.5, 1.5]), 2, torch.device("cpu"))
    with pytest.raises(ValueError, match="hashable"):
        group_ids([[1], [2]], 2, torch.device("cpu"))
