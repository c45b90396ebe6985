"""The policy loss modes (gspo, cispo, gpg, clip_cov, kl_cov) and the ReMax / GPG estimators against per-token
Python loops written from verl's formulas (verl b178a3c, verl/trainer/ppo/core_algos.py: compute_policy_loss_gspo,
_cispo, _gpg, _clip_cov, _kl_cov, compute_remax_outcome_advantage, compute_gpg_outcome_advantage)."""

from __future__ import annotations

import math

import pytest
import torch

from hpcppo import estimators
from hpcppo.algos import (
    POLICY_LOSSES,
    AdvantageInputs,
    PolicyLossParams,
    compute_advantage,
    compute_policy_loss,
    gpg_advantage,
    policy_loss,
    remax_advantage,
)
from hpcppo.config.experiment import POLICY_LOSS_MODES, PolicyLossSection
from hpcppo.config.fields import FieldValueError

OLD = [[-1.0, -0.5, -2.0, -0.3], [-0.7, -1.2, -0.1, -0.9], [-0.2, -0.4, -0.6, -0.8]]
NEW = [[-0.6, -0.9, -1.0, -0.3], [-0.7, -1.0, -0.4, -1.5], [-0.25, -0.1, -0.6, -0.3]]
ADV = [[1.0, 1.0, 1.0, 1.0], [-2.0, -2.0, -2.0, -2.0], [0.5, -0.5, 1.5, 0.0]]
MASK = [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]]
LOW, HIGH = 0.2, 0.28


def tensors():
    new = torch.tensor(NEW, dtype=torch.float64, requires_grad=True)
    return torch.tensor(OLD, dtype=torch.float64), new, torch.tensor(ADV, dtype=torch.float64), torch.tensor(MASK)


def cells(mask=MASK):
    return [(i, t) for i, row in enumerate(mask) for t, m in enumerate(row) if m]


def token_mean(loss):  # loss: {(i, t): value} over the mask
    return math.fsum(loss.values()) / len(loss)


def masked_mean(values):
    return math.fsum(values.values()) / (len(values) + 1e-8)


def run(mode, **params):
    old, new, adv, mask = tensors()
    p = PolicyLossParams(clip_ratio_low=LOW, clip_ratio_high=HIGH, **params)
    out = compute_policy_loss(mode, old, new, adv, mask, params=p)
    out["loss"].backward()
    return out, new.grad


def test_the_registry_is_the_configs_list_and_vanilla_is_policy_loss():
    assert tuple(m for m in POLICY_LOSSES if m != "bypass_mode") == POLICY_LOSS_MODES  # bypass: rollout correction's
    old, new, adv, mask = tensors()
    got = compute_policy_loss("vanilla", old, new, adv, mask, params=PolicyLossParams(clip_ratio_low=LOW,
                                                                                      clip_ratio_high=HIGH))
    ref = policy_loss(old, new, adv, mask, None, LOW, HIGH, 3.0)
    assert all(torch.equal(got[k], ref[k]) for k in ref)
    with pytest.raises(ValueError, match="unknown policy loss 'sappo'; known: vanilla, gspo"):
        compute_policy_loss("sappo", old, new, adv, mask)


def test_gspo_uses_the_sequence_ratio_and_seq_mean_token_mean():
    out, grad = run("gspo")
    seqs, clipfrac, expected_grad = [], {}, {}
    for i, row in enumerate(MASK):
        ts = [t for t, m in enumerate(row) if m]
        s = math.exp(min(math.fsum(NEW[i][t] - OLD[i][t] for t in ts) / len(ts), 10.0))
        per_token = []
        for t in ts:
            a = ADV[i][t]
            l1, l2 = -a * s, -a * min(max(s, 1 - LOW), 1 + HIGH)
            per_token.append(max(l1, l2))
            clipfrac[i, t] = float(l2 > l1)
            # d s_it / d logp_t = s_it: the unclipped branch carries the gradient, the clipped one none
            expected_grad[i, t] = (-a * s if l1 >= l2 else 0.0) / (len(ts) + 1e-8) / len(MASK)
        seqs.append(math.fsum(per_token) / (len(ts) + 1e-8))  # verl's agg_loss: sum / (n + 1e-8) per sequence
    assert out["loss"].item() == pytest.approx(math.fsum(seqs) / len(seqs), abs=1e-12)
    assert out["pg_clipfrac"].item() == pytest.approx(masked_mean(clipfrac), abs=1e-12)
    assert out["pg_clipfrac_lower"].item() == 0.0
    kl = {(i, t): OLD[i][t] - NEW[i][t] for i, t in cells()}
    assert out["ppo_kl"].item() == pytest.approx(masked_mean(kl), abs=1e-12)
    for (i, t), g in expected_grad.items():
        assert grad[i, t].item() == pytest.approx(g, abs=1e-12), (i, t)
    # gspo ignores loss_agg_mode for its own term (verl passes seq-mean-token-mean explicitly)
    old, new, adv, mask = tensors()
    p = PolicyLossParams(clip_ratio_low=LOW, clip_ratio_high=HIGH)
    assert torch.equal(compute_policy_loss("gspo", old, new, adv, mask, params=p, loss_agg_mode="token-mean")["loss"],
                       out["loss"].detach())


def test_cispo_weights_reinforce_by_the_stopped_clipped_ratio():
    out, grad = run("cispo")
    loss, clipped, n = {}, {}, len(cells())
    for i, t in cells():
        r = math.exp(max(min(NEW[i][t] - OLD[i][t], 20.0), -20.0))
        w = min(max(r, 1 - LOW), 1 + HIGH)
        loss[i, t] = -w * ADV[i][t] * NEW[i][t]
        clipped[i, t] = float(r != w)
        assert grad[i, t].item() == pytest.approx(-w * ADV[i][t] / n, abs=1e-12)  # no gradient through the weight
    assert out["loss"].item() == pytest.approx(token_mean(loss), abs=1e-12)
    assert out["pg_clipfrac"].item() == pytest.approx(masked_mean(clipped), abs=1e-12)
    assert 0 < out["pg_clipfrac"].item() < 1 and out["pg_clipfrac_lower"].item() == 0.0


def test_gpg_is_minus_logp_times_advantage_without_metrics():
    out, grad = run("gpg")
    assert out.keys() == {"loss"}
    assert out["loss"].item() == pytest.approx(token_mean({(i, t): -NEW[i][t] * ADV[i][t] for i, t in cells()}))
    assert grad[1, 3].item() == pytest.approx(2.0 / len(cells()))


def _cov(values_a, values_b, mask=MASK):
    keys = cells(mask)
    mean_a = math.fsum(values_a[i][t] for i, t in keys) / (len(keys) + 1e-8)
    mean_b = math.fsum(values_b[i][t] for i, t in keys) / (len(keys) + 1e-8)
    return {(i, t): (values_a[i][t] - mean_a) * (values_b[i][t] - mean_b) for i, t in keys}


def test_clip_cov_cuts_the_gradient_of_covariance_outliers_ppo_did_not_clip():
    cov = _cov(ADV, NEW)
    lb, ub = 0.05, 5.0
    ppo = {}
    for i, t in cells():
        r = math.exp(NEW[i][t] - OLD[i][t])
        a = ADV[i][t]
        ppo[i, t] = (max(-a * r, -a * min(max(r, 1 - LOW), 1 + HIGH)), -a * min(max(r, 1 - LOW), 1 + HIGH) > -a * r)
    candidates = {k for k, c in cov.items() if lb < c < ub and not ppo[k][1]}
    assert 2 <= len(candidates) < len(cells())  # the inputs exercise both sides
    # A ratio that allows every candidate: all of them are cut (no randomness left), as verl's randperm prefix would.
    out, grad = run("clip_cov", clip_cov_ratio=1.0, clip_cov_lb=lb, clip_cov_ub=ub)
    expected = {k: (0.0 if k in candidates else v) for k, (v, _) in ppo.items()}
    assert out["loss"].item() == pytest.approx(token_mean(expected), abs=1e-12)
    assert out["pg_clipfrac"].item() == pytest.approx(len(candidates) / (len(cells()) + 1e-8), abs=1e-12)
    assert all(grad[k].item() == 0.0 for k in candidates)
    kl = {(i, t): OLD[i][t] - NEW[i][t] for i, t in cells()}
    assert out["ppo_kl"].item() == pytest.approx(masked_mean(kl), abs=1e-12) and "pg_clipfrac_lower" not in out
    # max(1, int(ratio x tokens)) = 1 token, drawn among the candidates by the generator: reproducible per seed.
    cut = []
    for seed in range(6):
        out, grad = run("clip_cov", clip_cov_ratio=0.1, clip_cov_lb=lb, clip_cov_ub=ub,
                        generator=torch.Generator().manual_seed(seed))
        zero = {k for k in cells() if grad[k].item() == 0.0 and ppo[k][0] != 0.0 and k not in
                {(i, t) for (i, t), (_, c) in ppo.items() if c}}
        assert len(zero) == 1 and zero <= candidates
        assert out["pg_clipfrac"].item() == pytest.approx(1 / (len(cells()) + 1e-8))
        cut.append(next(iter(zero)))
    assert len(set(cut)) > 1
    again, _ = run("clip_cov", clip_cov_ratio=0.1, clip_cov_lb=lb, clip_cov_ub=ub,
                   generator=torch.Generator().manual_seed(5))
    assert torch.equal(again["loss"], out["loss"])


def test_kl_cov_penalises_the_top_covariance_tokens():
    keys = cells()
    mean_a = math.fsum(ADV[i][t] for i, t in keys) / len(keys)
    mean_l = math.fsum(NEW[i][t] for i, t in keys) / len(keys)
    cov = {(i, t): (ADV[i][t] - mean_a) * (NEW[i][t] - mean_l) for i, t in keys}
    for ratio, coef in ((0.3, 0.1), (0.0002, 1.0)):
        k = max(1, int(len(keys) * ratio))
        top = set(sorted(cov, key=cov.__getitem__, reverse=True)[:k])
        out, _ = run("kl_cov", kl_cov_ratio=ratio, ppo_kl_coef=coef)
        loss = {}
        for i, t in keys:
            d = NEW[i][t] - OLD[i][t]
            loss[i, t] = -ADV[i][t] * math.exp(d) + (coef * abs(d) if (i, t) in top else 0.0)
        assert out["loss"].item() == pytest.approx(token_mean(loss), abs=1e-12), ratio
        assert out["ppo_kl"].item() == pytest.approx(
            masked_mean({(i, t): abs(NEW[i][t] - OLD[i][t]) for i, t in keys}), abs=1e-12)
        assert out.keys() == {"loss", "ppo_kl"}


def test_mode_parameters_are_refused_where_they_do_nothing():
    assert PolicyLossSection(loss_mode="kl_cov", kl_cov_ratio=0.01, ppo_kl_coef=1.0).ppo_kl_coef == 1.0
    with pytest.raises(FieldValueError, match="clip_cov_ratio.*loss_mode = \"clip_cov\".*\"gspo\""):
        PolicyLossSection(loss_mode="gspo", clip_cov_ratio=0.01)
    with pytest.raises(FieldValueError, match="ppo_kl_coef"):
        PolicyLossSection(ppo_kl_coef=1.0)


REWARDS = [[0.0, 0.0, 1.0, 0.0], [0.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0],
           [0.0, 0.0, 0.0, 0.25]]
RMASK = [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]]


def test_remax_is_return_to_go_minus_the_greedy_score():
    baselines = [0.5, 1.0, 0.0, 2.0, -1.0]
    adv, ret = remax_advantage(torch.tensor(REWARDS), torch.tensor(baselines), torch.tensor(RMASK))
    for i, row in enumerate(REWARDS):
        for t in range(4):
            go = math.fsum(row[s] * RMASK[i][s] for s in range(t, 4))
            assert ret[i, t].item() == pytest.approx(go) and adv[i, t].item() == pytest.approx(go - baselines[i] * RMASK[i][t])
    inputs = AdvantageInputs(token_level_rewards=torch.tensor(REWARDS), response_mask=torch.tensor(RMASK))
    with pytest.raises(ValueError, match="'remax' needs the greedy responses' scores"):
        compute_advantage("remax", inputs)
    assert estimators.needs_greedy_baseline("remax") and not estimators.needs_critic("remax")


def test_gpg_estimator_scales_the_group_centred_score_by_batch_over_nonzero():
    index = ["a", "a", "b", "b", "c"]  # "c" is alone: mean 0
    adv, ret = gpg_advantage(torch.tensor(REWARDS), torch.tensor(RMASK), index)
    scores = [math.fsum(r) for r in REWARDS]
    alpha = len(scores) / max(1, sum(s != 0 for s in scores))
    for i, s in enumerate(scores):
        group = [scores[j] for j in range(5) if index[j] == index[i]]
        mean = math.fsum(group) / len(group) if len(group) > 1 else 0.0
        for t in range(4):
            assert adv[i, t].item() == pytest.approx(alpha * (s - mean) * RMASK[i][t])
    assert torch.equal(adv, ret)
    got, _ = compute_advantage("gpg", AdvantageInputs(token_level_rewards=torch.tensor(REWARDS),
                                                      response_mask=torch.tensor(RMASK), index=index))
    assert torch.equal(got, adv) and estimators.needs_groups("gpg")
