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
        generator: clip_cov's random choice among its candidates (None: torch's global generator).
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    generator: torch.Generator | None = None


PolicyLossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, str, PolicyLossParams,
                         GlobalBatchInfo | None], dict[str, torch.Tensor]]
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
                        params: PolicyLossParams | None = None,
                        batch_info: GlobalBatchInfo | None = None) -> dict[str, torch.Tensor]:
    """Run policy loss mode ``name`` on one (micro-)batch; ``ValueError`` listing the modes for an unknown name."""
    fn = POLICY_LOSSES.get(name)
    if fn is None:
        raise ValueError(f"unknown policy loss {name!r}; known: {', '.join(POLICY_LOSSES)}")
    return fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, params or PolicyLossParams(),
              batch_info)


def _upcast(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype]:
    dtype = compute_dtype(old_log_prob, log_prob, advantages)
    return old_log_prob.to(dtype), log_prob.to(dtype), advantages.to(dtype), dtype


def _ranks(keys: torch.Tensor, descending: bool) -> torch.Tensor:
    """The rank of each element of a flat tensor in sorted order (0 = first), stable for equal keys."""
    order = torch.sort(keys, descending=descending, stable=True).indices
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(order.numel(), device=order.device)
    return ranks


@register_policy_loss("vanilla")
def _vanilla(old: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
             p: PolicyLossParams, info: GlobalBatchInfo | None) -> dict[str, torch.Tensor]:
    """verl's ``compute_policy_loss_vanilla``: :func:`hpcppo.algos.losses.policy_loss`."""
    return policy_loss(old, logp, adv, mask, None, p.clip_ratio_low, p.clip_ratio_high, p.clip_ratio_c, mode,
                       batch_info=info)


@register_policy_loss("gspo")
def _gspo(old: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
          p: PolicyLossParams, info: GlobalBatchInfo | None) -> dict[str, torch.Tensor]:
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
    loss = agg_loss(torch.maximum(losses1, losses2), mask, "seq-mean-token-mean", batch_info=info)
    with torch.no_grad():
        return {"loss": loss, "pg_clipfrac": masked_mean((losses2 > losses1).to(dtype), mask),
                "pg_clipfrac_lower": torch.zeros((), dtype=dtype, device=loss.device),
                "ppo_kl": masked_mean(-log_ratio.detach(), mask)}


@register_policy_loss("cispo")
def _cispo(old: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
           p: PolicyLossParams, info: GlobalBatchInfo | None) -> dict[str, torch.Tensor]:
    """CISPO (arXiv:2506.13585), verl's ``compute_policy_loss_cispo``: ``-sg(clamp(r, 1 - low, 1 + high)) * A * logp``
    with ``r = exp(clamp(logp - old, -20, 20))``: the clipped ratio only weights the REINFORCE term, every token keeps
    its gradient. ``pg_clipfrac`` = share of tokens whose ratio was clipped, ``pg_clipfrac_lower`` 0."""
    old, logp, adv, dtype = _upcast(old, logp, adv)
    log_ratio = torch.clamp(logp - old, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - p.clip_ratio_low, 1 + p.clip_ratio_high)
    loss = agg_loss(-clipped.detach() * adv * logp, mask, mode, batch_info=info)
    with torch.no_grad():
        return {"loss": loss, "pg_clipfrac": masked_mean((ratio != clipped).to(dtype), mask),
                "pg_clipfrac_lower": torch.zeros((), dtype=dtype, device=loss.device),
                "ppo_kl": masked_mean(-log_ratio.detach(), mask)}


@register_policy_loss("gpg")
def _gpg(old: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
         p: PolicyLossParams, info: GlobalBatchInfo | None) -> dict[str, torch.Tensor]:
    """GPG (arXiv:2504.02546), verl's ``compute_policy_loss_gpg``: ``-logp * A``, no ratio, no clip, no metrics."""
    _, logp, adv, _ = _upcast(old, logp, adv)
    return {"loss": agg_loss(-logp * adv, mask, mode, batch_info=info)}


@register_policy_loss("clip_cov")
def _clip_cov(old: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
              p: PolicyLossParams, info: GlobalBatchInfo | None) -> dict[str, torch.Tensor]:
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
    loss = agg_loss(torch.maximum(losses1, losses2) * corr, mask, mode, batch_info=info)
    with torch.no_grad():
        return {"loss": loss, "pg_clipfrac": masked_mean(cut.to(dtype), mask),
                "ppo_kl": masked_mean(-log_ratio.detach(), mask)}


@register_policy_loss("kl_cov")
def _kl_cov(old: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
            p: PolicyLossParams, info: GlobalBatchInfo | None) -> dict[str, torch.Tensor]:
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
    loss = agg_loss(torch.where(top, losses + p.ppo_kl_coef * abs_kl, losses), mask, mode, batch_info=info)
    with torch.no_grad():
        return {"loss": loss, "ppo_kl": masked_mean(abs_kl.detach(), mask)}
