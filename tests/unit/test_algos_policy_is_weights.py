"""rollout_is_weights in every policy loss mode, bypass mode, and the sapo / geo_mean modes against hand
computations of verl's formulas (verl b178a3c, verl/trainer/ppo/core_algos.py)."""

from __future__ import annotations

import math

import pytest
import torch

from hpcppo.algos import POLICY_LOSSES, GlobalBatchInfo, PolicyLossParams, compute_policy_loss, policy_loss
from hpcppo.algos.rollout_correction import RolloutCorrectionParams, compute_rollout_correction_and_rejection_mask
from hpcppo.config.experiment import POLICY_LOSS_MODES

B, T = 3, 4


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5
    logp = (old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).clone()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float64)
    return old, logp, adv, mask


def _params() -> PolicyLossParams:
    # clip_cov / kl_cov pick tokens: ratios large enough that some are chosen, the same generator every call
    return PolicyLossParams(clip_cov_ratio=0.3, clip_cov_lb=-10.0, clip_cov_ub=10.0, kl_cov_ratio=0.3,
                            generator=torch.Generator().manual_seed(3))


def _loss(mode: str, w=None, agg="token-mean", info=None, params=None):
    old, logp, adv, mask = _batch()
    return compute_policy_loss(mode, old, logp, adv, mask, loss_agg_mode=agg, params=params or _params(),
                               batch_info=info, rollout_is_weights=w)


TOKEN_MODES = [m for m in POLICY_LOSSES if m not in ("geo_mean", "bypass_mode")]


def test_every_user_mode_is_in_the_registry_and_the_config():
    assert set(POLICY_LOSS_MODES) == set(POLICY_LOSSES) - {"bypass_mode"}


@pytest.mark.parametrize("mode", TOKEN_MODES)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum"])
def test_weights_multiply_each_tokens_loss_before_aggregation(mode, agg):
    """verl: ``pg_losses = pg_losses * rollout_is_weights`` then agg_loss. So the loss is linear in the weights:
    the weighted loss is the sum over tokens of w_t times the loss with a one-hot weight on t."""
    base = _loss(mode, agg=agg)["loss"].item()
    assert _loss(mode, torch.ones(B, T, dtype=torch.float64), agg)["loss"].item() == pytest.approx(base)
    g = torch.Generator().manual_seed(7)
    w = torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    weighted = _loss(mode, w, agg)["loss"].item()
    parts = 0.0
    for i in range(B):
        for j in range(T):
            one = torch.zeros(B, T, dtype=torch.float64)
            one[i, j] = 1.0
            parts += w[i, j].item() * _loss(mode, one, agg)["loss"].item()
    assert weighted == pytest.approx(parts, rel=1e-9, abs=1e-12)
    assert weighted != pytest.approx(base)


@pytest.mark.parametrize("mode", TOKEN_MODES)
def test_metrics_do_not_see_the_weights_and_gradients_do(mode):
    a, b = _loss(mode), _loss(mode, torch.full((B, T), 0.5, dtype=torch.float64))
    for key in a:
        if key != "loss":
            assert torch.equal(a[key], b[key]), key
    assert b["loss"].item() == pytest.approx(0.5 * a["loss"].item())


def test_vanilla_with_weights_by_hand():
    old, logp, adv, mask = _batch()
    w = torch.rand(B, T, dtype=torch.float64)
    out = compute_policy_loss("vanilla", old, logp, adv, mask, rollout_is_weights=w)
    ratio = torch.exp(logp.detach() - old)
    l1, l2 = -adv * ratio, -adv * ratio.clamp(0.8, 1.2)
    lc = torch.maximum(l1, l2)
    pg = torch.where(adv < 0, torch.minimum(lc, -adv * 3.0), lc)
    assert out["loss"].item() == pytest.approx(((pg * w * mask).sum() / mask.sum()).item())


def test_geo_mean_by_hand_with_geometric_mean_of_weights():
    old, logp, adv, mask = _batch()
    w = torch.rand(B, T, dtype=torch.float64) + 0.5
    out = compute_policy_loss("geo_mean", old, logp, adv, mask, params=PolicyLossParams(), rollout_is_weights=w)
    want = 0.0
    for i in range(B):
        n = int(mask[i].sum())
        a = adv[i, 0].item()
        s = math.copysign(1.0, a)
        logs = []
        for j in range(n):
            x = (logp[i, j] - old[i, j]).item()
            c = min(max(x, -0.2), 0.2)
            logs.append(s * min(s * x, s * c))
        ratio = math.exp(sum(logs) / n)
        geo_w = math.exp(sum(math.log(w[i, j].item() + 1e-10) for j in range(n)) / n)
        want += -a * ratio * geo_w
    assert out["loss"].item() == pytest.approx(want / B)
    # with the global batch info the rows add up over micro-batches: sum / sequences x dp
    info = GlobalBatchInfo(batch_num_tokens=mask.sum(), global_batch_size=6, dp_size=2)
    split = compute_policy_loss("geo_mean", old, logp, adv, mask, batch_info=info, rollout_is_weights=w)
    assert split["loss"].item() == pytest.approx(want / 6 * 2)


def test_sapo_by_hand():
    old, logp, adv, mask = _batch()
    p = PolicyLossParams(tau_pos=1.0, tau_neg=1.05)
    out = compute_policy_loss("sapo", old, logp, adv, mask, loss_agg_mode="token-mean", params=p)
    total = 0.0
    for i in range(B):
        n = int(mask[i].sum())
        a = adv[i, 0].item()
        tau = 1.0 if a > 0 else 1.05
        seq = sum(-(4 / tau) / (1 + math.exp(-tau * (math.exp((logp[i, j] - old[i, j]).item()) - 1))) * a
                  for j in range(n))
        total += seq / n
    assert out["loss"].item() == pytest.approx(total / B)  # seq-mean-token-mean whatever loss_agg_mode says
    assert out["pg_clipfrac"].item() == 0.0
    out["loss"].backward()
    assert logp.grad is not None and logp.grad.abs().sum() > 0


def _bypass(rc: RolloutCorrectionParams, agg="token-mean", batch=None):
    rollout, logp, adv, mask = batch or _batch()
    return compute_policy_loss("bypass_mode", rollout, logp, adv, mask, loss_agg_mode=agg,
                               params=PolicyLossParams(rollout_correction=rc))


def test_bypass_ppo_clip_is_vanilla_against_the_rollout_without_weights():
    rollout, logp, adv, mask = _batch()
    plain = policy_loss(rollout, logp, adv, mask, 0.2)
    out = _bypass(RolloutCorrectionParams(rollout_is="token", loss_type="ppo_clip"))
    assert out["loss"].item() == pytest.approx(plain["loss"].item())  # weights not applied (no double count)
    assert "rollout_corr/rollout_is_mean" in out and "rollout_corr/kl" in out


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_bypass_reinforce_applies_current_over_rollout_weights(level):
    rollout, logp, adv, mask = batch = _batch()
    out = _bypass(RolloutCorrectionParams(rollout_is=level, rollout_is_threshold=1.5, loss_type="reinforce"),
                  batch=batch)
    w, _, _ = compute_rollout_correction_and_rejection_mask(logp.detach(), rollout, mask, level, 1.5)
    assert w is not None
    want = (-adv * logp.detach() * w * mask).sum() / mask.sum()
    assert out["loss"].item() == pytest.approx(want.item())
    assert out["ppo_kl"].item() == pytest.approx(((rollout - logp.detach()) * mask).sum().item() / mask.sum().item())
    out["loss"].backward()
    assert torch.allclose(logp.grad, -adv * w * mask / mask.sum())  # the weights carry no gradient


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
def test_bypass_rejection_drops_tokens_from_the_loss(loss_type):
    rollout, logp, adv, mask = _batch()
    rc = RolloutCorrectionParams(rollout_rs="token_k2", rollout_rs_threshold=0.02, loss_type=loss_type)
    out = _bypass(rc)
    _, kept, _ = compute_rollout_correction_and_rejection_mask(logp.detach(), rollout, mask, None, 2.0, False,
                                                                "token_k2", 0.02)
    assert 0 < kept.sum() < mask.sum()
    if loss_type == "ppo_clip":
        want = policy_loss(rollout, logp, adv, kept, 0.2)["loss"].item()
    else:
        want = ((-adv * logp.detach() * kept).sum() / kept.sum()).item()
    assert out["loss"].item() == pytest.approx(want)
    assert out["rollout_corr/rollout_rs_masked_fraction"].item() == pytest.approx(1 - (kept.sum() / mask.sum()).item())


def test_bypass_needs_its_settings():
    rollout, logp, adv, mask = _batch()
    with pytest.raises(ValueError, match="rollout_correction"):
        compute_policy_loss("bypass_mode", rollout, logp, adv, mask)
    with pytest.raises(ValueError, match="loss_type"):
        _bypass(RolloutCorrectionParams(loss_type="ppo"))
