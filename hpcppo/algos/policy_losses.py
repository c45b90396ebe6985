"""Policy loss modes by name, with verl's semantics: ``vanilla`` (PPO clip, dual clip), ``gspo``, ``cispo``, ``gpg``,
``clip_cov``, ``kl_cov`` (verl b178a3c, ``verl/trainer/ppo/core_algos.py``: the ``register_policy_loss`` registry
and each ``compute_policy_loss_<mode>``).

    out = compute_policy_loss("gspo", old_log_prob, log_prob, advantages, response_mask,
                              params=PolicyLossParams(clip_ratio_low=3e-4, clip_ratio_high=4e-4))
    out["loss"].backward()

Every mode has one signature, ``(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, params,
batch_info) -> {"loss": ..., <metrics>}``: ``loss`` keeps its graph, each metric is a detached 0-d tensor, and a mode
returns only the metrics verl's reports (``gpg`` none, ``kl_cov`` only ``ppo_kl``, which is then the mean *absolute*
log-ratio, as verl's). No ``.item()``: ``clip_cov`` and ``kl_cov`` select their tokens with tensor ranks, not host
counts, and ``clip_cov``'s random choice draws from the caller's generator (verl uses ``torch.randperm`` on the
global generator; which tokens are chosen then differs, how many and among which does not).

The torch-free list of names is :data:`hpcppo.config.experiment.POLICY_LOSS_MODES` (a test keeps the two equal).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hpcppo.algos.losses import GlobalBatchInfo, agg_loss, policy_loss
from hpcppo.algos.rollout_correction import (AllReduce, RolloutCorrectionParams,
                                             compute_rollout_correction_and_rejection_mask)
from hpcppo.algos.stats import compute_dtype, masked_mean

__all__ = ["POLICY_LOSSES", "PolicyLossParams", "compute_policy_loss", "register_policy_loss"]


@dataclass(frozen=True)
class PolicyLossParams:
    """The parameters of every mode (each reads its own), with verl's defaults (``actor.yaml``, ``policy_loss``).

    Attributes:
        clip_ratio_low, clip_ratio_high: the clip range ``[1 - low, 1 + high]`` (vanilla, gspo, cispo, clip_cov).
        clip_ratio_c: the dual-clip bound (vanilla).
        clip_cov_ratio, clip_cov_lb, clip_cov_ub: clip_cov's share of tokens and covariance window.
        kl_cov_ratio, ppo_kl_coef: kl_cov's share of tokens and the coefficient of their ``|log ratio|`` penalty.
        tau_pos, tau_neg: sapo's gate temperatures for positive and non-positive advantages (verl's actor.yaml).
        generator: clip_cov's random choice among its candidates (None: torch's global generator).
        rollout_correction: bypass_mode's settings (verl's ``policy_loss.rollout_correction``).
        all_reduce_sum: bypass_mode's batch normalisation over ranks (see :mod:`hpcppo.algos.rollout_correction`).
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    generator: torch.Generator | None = None
    rollout_correction: RolloutCorrectionParams | None = None
    all_reduce_sum: AllReduce | None = None


PolicyLossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, str, PolicyLossParams,
                         GlobalBatchInfo | None, torch.Tensor | None], dict[str, torch.Tensor]]
POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss mode under ``name`` (names are unique)."""

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return decorator


def compute_policy_loss(name: str, old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                        response_mask: torch.Tensor, *, loss_agg_mode: str = "token-mean",
                        params: PolicyLossParams | None = None, batch_info: GlobalBatchInfo | None = None,
                        rollout_is_weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Run policy loss mode ``name`` on one (micro-)batch; ``ValueError`` listing the modes for an unknown name.

    ``rollout_is_weights`` (``[B, T]``, detached: :mod:`hpcppo.algos.rollout_correction`) multiply each token's loss
    before aggregation in every mode, as verl applies them (``geo_mean`` takes their per-sequence geometric mean;
    ``bypass_mode`` ignores them and computes its own)."""
    fn = POLICY_LOSSES.get(name)
    if fn is None:
        raise ValueError(f"unknown policy loss {name!r}; known: {', '.join(POLICY_LOSSES)}")
    return fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, params or PolicyLossParams(),
              batch_info, rollout_is_weights)


def _upcast(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype]:
    dtype = compute_dtype(old_log_prob, log_prob, advantages)
    return old_log_prob.to(dtype), log_prob.to(dtype), advantages.to(dtype), dtype


def _weighted(losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """verl's ``if rollout_is_weights is not None: pg_losses = pg_losses * rollout_is_weights``."""
    return losses if rollout_is_weights is None else losses * rollout_is_weights.to(losses.dtype)


def _ranks(keys: torch.Tensor, descending: bool) -> torch.Tensor:
    """The rank of each element of a flat tensor in sorted order (0 = first), stable for equal keys."""
    order = torch.sort(keys, descending=descending, stable=True).indices
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(order.numel(), device=order.device)
    return ranks


@register_policy_loss("vanilla")
def _vanilla(old: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
             p: PolicyLossParams, info: GlobalBatchInfo | None, w: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """verl's ``compute_policy_loss_vanilla``: :func:`hpcppo.algos.losses.policy_loss`."""
    return policy_loss(old, logp, adv, mask, None, p.clip_ratio_low, p.clip_ratio_high, p.clip_ratio_c, mode,
                       batch_info=info, rollout_is_weights=w)


@register_policy_loss("gspo")
def _gspo(old: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
          p: PolicyLossParams, info: GlobalBatchInfo | None, w: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """GSPO (arXiv:2507.18071), verl's ``compute_policy_loss_gspo``: the sequence's importance ratio
    ``s_i = exp(mean_t(logp - old))`` (stop-gradient) times ``pi / sg(pi)`` per token, so
    ``log s_it = logp - sg(logp) + sg(mean_t(logp - old))``, clamped at 10 before ``exp``; clipped like PPO to
    ``[1 - low, 1 + high]`` without dual clip; aggregated ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says (verl
    passes that mode to ``agg_loss`` explicitly; ``loss_agg_mode`` still aggregates the entropy and KL terms).
    ``pg_clipfrac_lower`` is 0, ``ppo_kl`` the token mean of ``old - logp``."""
    old, logp, adv, dtype = _upcast(old, logp, adv)
    m = mask.to(dtype)
    log_ratio = logp - old
    seq_log_ratio = (log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1)
    log_s = torch.clamp(logp - logp.detach() + seq_log_ratio.detach().unsqueeze(-1), max=10.0)
    s = torch.exp(log_s)
    losses1 = -adv * s
    losses2 = -adv * torch.clamp(s, 1 - p.clip_ratio_low, 1 + p.clip_ratio_high)
    loss = agg_loss(_weighted(torch.maximum(losses1, losses2), w), mask, "seq-mean-token-mean", batch_info=info)
    with torch.no_grad():
        return {"loss": loss, "pg_clipfrac": masked_mean((losses2 > losses1).to(dtype), mask),
                "pg_clipfrac_lower": torch.zeros((), dtype=dtype, device=loss.device),
                "ppo_kl": masked_mean(-log_ratio.detach(), mask)}


@register_policy_loss("cispo")
def _cispo(old: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
           p: PolicyLossParams, info: GlobalBatchInfo | None, w: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """CISPO (arXiv:2506.13585), verl's ``compute_policy_loss_cispo``: ``-sg(clamp(r, 1 - low, 1 + high)) * A * logp``
    with ``r = exp(clamp(logp - old, -20, 20))``: the clipped ratio only weights the REINFORCE term, every token keeps
    its gradient. ``pg_clipfrac`` = share of tokens whose ratio was clipped, ``pg_clipfrac_lower`` 0."""
    old, logp, adv, dtype = _upcast(old, logp, adv)
    log_ratio = torch.clamp(logp - old, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - p.clip_ratio_low, 1 + p.clip_ratio_high)
    loss = agg_loss(_weighted(-clipped.detach() * adv * logp, w), mask, mode, batch_info=info)
    with torch.no_grad():
        return {"loss": loss, "pg_clipfrac": masked_mean((ratio != clipped).to(dtype), mask),
                "pg_clipfrac_lower": torch.zeros((), dtype=dtype, device=loss.device),
                "ppo_kl": masked_mean(-log_ratio.detach(), mask)}


@register_policy_loss("gpg")
def _gpg(old: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
         p: PolicyLossParams, info: GlobalBatchInfo | None, w: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """GPG (arXiv:2504.02546), verl's ``compute_policy_loss_gpg``: ``-logp * A``, no ratio, no clip, no metrics."""
    _, logp, adv, _ = _upcast(old, logp, adv)
    return {"loss": agg_loss(_weighted(-logp * adv, w), mask, mode, batch_info=info)}


@register_policy_loss("clip_cov")
def _clip_cov(old: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
              p: PolicyLossParams, info: GlobalBatchInfo | None, w: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Clip-Cov (arXiv:2505.22617), verl's ``compute_policy_loss_clip_cov``: PPO's clipped loss (ratio not clamped,
    no dual clip) with the gradient cut (loss x 0) on ``max(1, int(clip_cov_ratio x tokens))`` tokens drawn at random
    among those that PPO did not clip and whose ``(A - mean A) (logp - mean logp)`` lies in ``(lb, ub)`` (means over
    the micro-batch's response tokens). ``pg_clipfrac`` = share of the cut tokens."""
    if not p.clip_cov_ratio > 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {p.clip_cov_ratio}")
    old, logp, adv, dtype = _upcast(old, logp, adv)
    valid = mask > 0
    log_ratio = logp - old
    ratio = torch.exp(log_ratio)
    losses1 = -adv * ratio
    losses2 = -adv * torch.clamp(ratio, 1 - p.clip_ratio_low, 1 + p.clip_ratio_high)
    with torch.no_grad():
        clipped = (losses2 > losses1) & valid
        cov = (adv - masked_mean(adv, mask)) * (logp.detach() - masked_mean(logp.detach(), mask))
        candidates = (cov > p.clip_cov_lb) & (cov < p.clip_cov_ub) & valid & ~clipped
        n_cut = torch.clamp(torch.floor(p.clip_cov_ratio * mask.to(dtype).sum()), min=1)
        keys = torch.rand(cov.shape, generator=p.generator, device="cpu" if p.generator is None else
                          p.generator.device, dtype=dtype).to(cov.device)
        keys = torch.where(candidates, keys, torch.full_like(keys, float("inf")))
        cut = candidates & (_ranks(keys.flatten(), descending=False).view_as(keys) < n_cut)
        corr = (~cut).to(dtype)
    loss = agg_loss(_weighted(torch.maximum(losses1, losses2) * corr, w), mask, mode, batch_info=info)
    with torch.no_grad():
        return {"loss": loss, "pg_clipfrac": masked_mean(cut.to(dtype), mask),
                "ppo_kl": masked_mean(-log_ratio.detach(), mask)}


@register_policy_loss("kl_cov")
def _kl_cov(old: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
            p: PolicyLossParams, info: GlobalBatchInfo | None, w: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """KL-Cov (arXiv:2505.22617), verl's ``compute_policy_loss_kl_cov``: the unclipped ``-A * r`` (``r = exp(logp -
    old)``), plus ``ppo_kl_coef * |logp - old|`` on the ``max(1, int(kl_cov_ratio x tokens))`` response tokens with the
    largest ``(A - mean A) (logp - mean logp)`` (plain means over the micro-batch's response tokens). ``ppo_kl`` is the
    mean of ``|logp - old|`` (verl's ``ppo_kl_abs``)."""
    if not p.kl_cov_ratio > 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {p.kl_cov_ratio}")
    old, logp, adv, dtype = _upcast(old, logp, adv)
    valid = mask > 0
    log_ratio = logp - old
    abs_kl = log_ratio.abs()
    losses = -adv * torch.exp(log_ratio)
    with torch.no_grad():
        n = valid.to(dtype).sum()
        mean_adv = torch.where(valid, adv, 0).sum() / n.clamp(min=1)
        mean_logp = torch.where(valid, logp.detach(), 0).sum() / n.clamp(min=1)
        cov = (adv - mean_adv) * (logp.detach() - mean_logp)
        cov = torch.where(valid, cov, torch.full_like(cov, float("-inf")))
        k = torch.clamp(torch.floor(n * p.kl_cov_ratio), min=1)
        top = valid & (_ranks(cov.flatten(), descending=True).view_as(cov) < k)
    loss = agg_loss(_weighted(torch.where(top, losses + p.ppo_kl_coef * abs_kl, losses), w), mask, mode,
                    batch_info=info)
    with torch.no_grad():
        return {"loss": loss, "ppo_kl": masked_mean(abs_kl.detach(), mask)}


@register_policy_loss("sapo")
def _sapo(old: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
          p: PolicyLossParams, info: GlobalBatchInfo | None, w: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """SAPO (arXiv:2511.20347), verl's ``compute_policy_loss_sapo``: a smooth gate instead of a clip,
    ``-f(r) * A`` with ``f(r) = sigmoid(tau (r - 1)) * 4 / tau``, ``r = exp(clamp(logp - old, -20, 20))``, ``tau`` =
    ``tau_pos`` where ``A > 0`` else ``tau_neg``; aggregated ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says
    (as gspo). ``pg_clipfrac`` and ``pg_clipfrac_lower`` are 0."""
    old, logp, adv, dtype = _upcast(old, logp, adv)
    log_ratio = torch.clamp(logp - old, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    tau = torch.where(adv > 0, torch.as_tensor(p.tau_pos, dtype=dtype, device=adv.device),
                      torch.as_tensor(p.tau_neg, dtype=dtype, device=adv.device))
    gates = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss = agg_loss(_weighted(-gates * adv, w), mask, "seq-mean-token-mean", batch_info=info)
    zero = torch.zeros((), dtype=dtype, device=loss.device)
    with torch.no_grad():
        return {"loss": loss, "pg_clipfrac": zero, "pg_clipfrac_lower": zero,
                "ppo_kl": masked_mean(-log_ratio.detach(), mask)}


@register_policy_loss("geo_mean")
def _geo_mean(old: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
              p: PolicyLossParams, info: GlobalBatchInfo | None, w: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """GMPO (arXiv:2507.20673), verl's ``compute_policy_loss_geo_mean``: the geometric mean of the token ratios,
    each log-ratio clipped to ``[-low, high]`` on the side its advantage's sign makes pessimistic (``sgn(A) *
    min(sgn(A) x, sgn(A) clamp(x))``; no +-20 clamp), times the sequence's mean advantage: ``-mean_t(A) *
    exp(mean_t(clipped log r))`` per sequence. ``rollout_is_weights`` enter as their per-sequence geometric mean
    (``exp(mean_t log(w + 1e-10))``). ``loss_agg_mode`` is not used: verl takes the plain mean over the rows;
    with ``batch_info`` the sum is divided by the global number of non-empty sequences (x dp), so micro-batches add
    up. ``pg_clipfrac`` / ``pg_clipfrac_lower``: shares of tokens whose log-ratio left the range with ``A > 0`` /
    ``A < 0``."""
    old, logp, adv, dtype = _upcast(old, logp, adv)
    m = mask.to(dtype)
    log_ratio = logp - old
    sgn = torch.sign(adv)
    clamped = torch.clamp(log_ratio, -p.clip_ratio_low, p.clip_ratio_high)
    chosen = sgn * torch.minimum(sgn * log_ratio, sgn * clamped)
    length = m.sum(dim=-1)
    ratio = torch.exp((chosen * m).sum(dim=-1) / (length + 1e-8))
    seq_adv = (adv * m).sum(dim=-1) / (length + 1e-8)
    losses = -seq_adv * ratio
    if w is not None:
        losses = losses * torch.exp((torch.log(w.to(dtype) + 1e-10) * m).sum(dim=-1) / (length + 1e-8))
    if info is not None and info.global_batch_size is not None:
        loss = losses.sum() / info.global_batch_size * info.dp_size
    else:
        loss = losses.mean()
    with torch.no_grad():
        out = log_ratio.detach() != clamped.detach()
        return {"loss": loss, "pg_clipfrac": masked_mean((out & (adv > 0)).to(dtype), mask),
                "pg_clipfrac_lower": masked_mean((out & (adv < 0)).to(dtype), mask),
                "ppo_kl": masked_mean(-log_ratio.detach(), mask)}


def reinforce_loss(rollout_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                   response_mask: torch.Tensor, loss_agg_mode: str = "seq-mean-token-sum", *,
                   batch_info: GlobalBatchInfo | None = None,
                   rollout_is_weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """verl's ``compute_policy_loss_reinforce``: ``-A * logp`` (times the detached ``rollout_is_weights``), no ratio
    and no clip; ``ppo_kl`` = token mean of ``rollout_log_prob - logp``."""
    rollout_log_prob, log_prob, advantages, dtype = _upcast(rollout_log_prob, log_prob, advantages)
    loss = agg_loss(_weighted(-advantages * log_prob, rollout_is_weights), response_mask, loss_agg_mode,
                    batch_info=batch_info)
    with torch.no_grad():
        return {"loss": loss, "ppo_kl": masked_mean(rollout_log_prob - log_prob.detach(), response_mask)}


@register_policy_loss("bypass_mode")
def _bypass_mode(old: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
                 p: PolicyLossParams, info: GlobalBatchInfo | None, w: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """verl's ``compute_policy_loss_bypass_mode``: ``old`` *is* the rollout's log-probs (the old-log-prob pass is
    skipped). The correction runs here on the current policy against the rollout (``p.rollout_correction``: IS
    weights of ``pi_theta / pi_rollout``, rejection through the mask), then ``loss_type`` ``reinforce`` applies the
    weights to ``-A logp`` and ``ppo_clip`` runs vanilla PPO on the rejected mask without them (the PPO ratio is
    already ``pi_theta / pi_rollout``). ``w`` is ignored, as verl's; the ``rollout_corr/*`` metrics come back with
    the loss's."""
    rc = p.rollout_correction
    if rc is None:
        raise ValueError("bypass_mode needs PolicyLossParams.rollout_correction (the rollout correction's settings)")
    with torch.no_grad():
        weights, effective, metrics = compute_rollout_correction_and_rejection_mask(
            logp.detach(), old, mask, rc.rollout_is, rc.rollout_is_threshold, rc.rollout_is_batch_normalize,
            rc.rollout_rs, rc.rollout_rs_threshold, all_reduce_sum=p.all_reduce_sum)
    if rc.loss_type == "reinforce":
        out = reinforce_loss(old, logp, adv, effective, mode, batch_info=info, rollout_is_weights=weights)
    elif rc.loss_type == "ppo_clip":
        out = policy_loss(old, logp, adv, effective, None, p.clip_ratio_low, p.clip_ratio_high, p.clip_ratio_c, mode,
                          batch_info=info)
    else:
        raise ValueError(f"loss_type must be 'reinforce' or 'ppo_clip', got {rc.loss_type!r}")
    return out | metrics
