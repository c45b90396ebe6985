"""opo, grpo_passk, optimal_token_baseline and tir_optimal_token_baseline against hand computations of verl's
functions (verl b178a3c, verl/trainer/ppo/core_algos.py), and their registration."""

from __future__ import annotations

import math

import pytest
import torch

from hpcppo import estimators
from hpcppo.algos import (ADVANTAGE_ESTIMATORS, AdvantageInputs, compute_advantage, grpo_passk_advantage,
                          opo_advantage, optimal_token_baseline_advantage, tir_optimal_token_baseline_advantage)

D = torch.float64


def _outcome(scores, lengths, width=4):
    r = torch.zeros(len(scores), width, dtype=D)
    m = torch.zeros(len(scores), width, dtype=D)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        m[i, :n] = 1
        r[i, n - 1] = s
    return r, m


def test_opo_subtracts_the_length_weighted_group_mean():
    r, m = _outcome([1.0, 0.0, 2.0, 5.0], [2, 4, 1, 3])
    adv, ret = opo_advantage(r, m, ["a", "a", "a", "b"])
    b = (2 * 1.0 + 4 * 0.0 + 1 * 2.0) / 7
    want = [1.0 - b, 0.0 - b, 2.0 - b, 5.0]  # b alone in its group: no baseline
    for i, w in enumerate(want):
        assert torch.allclose(adv[i], w * m[i])
    assert torch.equal(adv, ret)


def test_grpo_passk_rewards_only_the_best_of_each_group():
    r, m = _outcome([1.0, 3.0, 2.0, 0.5, 0.5, 0.0], [1, 2, 3, 1, 2, 3])
    idx = [0, 0, 0, 1, 1, 1]
    adv, _ = grpo_passk_advantage(r, m, idx)
    std0 = torch.tensor([1.0, 3.0, 2.0], dtype=D).std().item()
    std1 = torch.tensor([0.5, 0.5, 0.0], dtype=D).std().item()
    want = [0, (3 - 2) / (std0 + 1e-6), 0, 0.0 / (std1 + 1e-6), 0, 0]  # tie at 0.5: the first row, r_max - r_2nd = 0
    for i, w in enumerate(want):
        assert torch.allclose(adv[i], w * m[i])
    adv, _ = grpo_passk_advantage(r, m, idx, norm_adv_by_std_in_grpo=False)
    assert adv[1].sum().item() == pytest.approx(1.0 * 2)  # 1 on each of its 2 tokens
    with pytest.raises(ValueError, match="at least 2"):
        grpo_passk_advantage(r, m, [0, 0, 0, 1, 1, 2])


def _otb_inputs():
    g = torch.Generator().manual_seed(5)
    r, m = _outcome([1.0, 0.0, 0.5, 2.0], [3, 2, 4, 2])
    old = -torch.rand(4, 4, generator=g, dtype=D)
    spi = torch.rand(4, 4, generator=g, dtype=D) * 0.5
    return r, m, old, spi


def _otb_by_hand(r, m, old, spi, idx, isw=None, zero_tail=False):
    B, T = r.shape
    G = [[sum(r[i, s].item() * m[i, s].item() for s in range(t, T)) for t in range(T)] for i in range(B)]
    W = []
    for i in range(B):
        acc, row = 0.0, []
        for t in range(T):
            w = 1 - 2 * math.exp(old[i, t].item()) + spi[i, t].item()
            if isw is not None:
                w *= isw[i, t].item() ** 2
            acc += w * m[i, t].item()
            row.append(acc)
        W.append(row)
    adv = torch.zeros(B, T, dtype=D)
    for i in range(B):
        members = [j for j in range(B) if idx[j] == idx[i]]
        lengths = sorted(int(m[j].sum()) for j in members)
        for t in range(T):
            if len(members) == 1:
                b = 0.0
            else:
                num = sum(G[j][t] * W[j][t] * m[j, t].item() for j in members)
                den = sum(W[j][t] * m[j, t].item() for j in members) + 1e-8
                b = num / den
                n_i = int(m[i].sum())
                if zero_tail and n_i == lengths[-1] and lengths.count(n_i) == 1 and n_i > lengths[-2] \
                        and t >= lengths[-2]:
                    b = 0.0
            adv[i, t] = (G[i][t] - b) * m[i, t].item()
    return adv, torch.tensor(G, dtype=D)


@pytest.mark.parametrize("zero_tail", [False, True])
def test_optimal_token_baseline_by_hand(zero_tail):
    r, m, old, spi = _otb_inputs()
    idx = ["p", "p", "p", "q"]
    isw = torch.rand(4, 4, generator=torch.Generator().manual_seed(9), dtype=D) + 0.5
    for weights in (None, isw):
        adv, ret = optimal_token_baseline_advantage(r, m, idx, old, spi, weights, handle_zero_tail=zero_tail)
        want_adv, want_ret = _otb_by_hand(r, m, old, spi, idx, weights, zero_tail)
        assert torch.allclose(ret, want_ret) and torch.allclose(adv, want_adv), (adv, want_adv)


def test_tir_optimal_token_baseline_counts_only_the_policys_tokens():
    r, m, old, spi = _otb_inputs()
    idx = ["p", "p", "p", "q"]
    # Interleave tool tokens (mask 0) inside responses: the TIR variant packs each row's policy tokens first.
    tool = torch.zeros(4, 2, dtype=D)
    m2 = torch.cat([m[:, :1], tool, m[:, 1:]], dim=1)
    r2 = torch.cat([r[:, :1], tool, r[:, 1:]], dim=1)
    old2 = torch.cat([old[:, :1], tool - 0.3, old[:, 1:]], dim=1)
    spi2 = torch.cat([spi[:, :1], tool + 0.9, spi[:, 1:]], dim=1)
    adv, ret = tir_optimal_token_baseline_advantage(r2, m2, idx, old2, spi2)
    packed, _ = _otb_by_hand(r, m, old, spi, idx, zero_tail=True)  # handle_zero_tail defaults to True here
    assert torch.allclose(adv[:, :1], packed[:, :1]) and torch.allclose(adv[:, 3:], packed[:, 1:])
    assert (adv[:, 1:3] == 0).all()
    assert torch.allclose(ret[:, 3:], (r2 * m2).flip(-1).cumsum(-1).flip(-1)[:, 3:])


def test_the_new_estimators_are_registered_with_their_needs():
    for name in ("opo", "grpo_passk", "optimal_token_baseline", "tir_optimal_token_baseline"):
        assert name in ADVANTAGE_ESTIMATORS and estimators.needs_groups(name)
    assert estimators.lookup("optimal_token_baseline").needs_sum_pi_squared
    assert not estimators.lookup("opo").needs_sum_pi_squared
    r, m = _outcome([1.0, 0.0, 2.0, 5.0], [2, 4, 1, 3])
    adv, _ = compute_advantage("opo", AdvantageInputs(token_level_rewards=r, response_mask=m, index=[0, 0, 0, 1]))
    assert torch.allclose(adv, opo_advantage(r, m, [0, 0, 0, 1])[0])
    with pytest.raises(ValueError, match="sum_pi_squared"):
        compute_advantage("optimal_token_baseline", AdvantageInputs(token_level_rewards=r, response_mask=m,
                                                                     index=[0, 0, 0, 1]))
