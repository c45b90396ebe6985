"""PPO losses with verl's semantics: loss aggregation, clipped policy loss (asymmetric + dual clip), clipped value
loss, entropy.

Shapes: ``[batch, response_len]``; ``response_mask`` selects the response tokens. Losses keep their autograd graph;
metrics are detached 0-d tensors (no ``.item()``: the caller decides when to sync). Low-precision inputs are upcast
to float32 before any ``exp`` or subtraction of log-probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hpcppo.algos.stats import compute_dtype, masked_mean, masked_sum

__all__ = [
    "LOSS_AGG_MODES",
    "GlobalBatchInfo",
    "agg_loss",
    "entropy_from_logits",
    "entropy_loss",
    "entropy_metric",
    "policy_loss",
    "value_loss",
]

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class GlobalBatchInfo:
    """Normalisers for gradient accumulation / data parallelism, as in verl's ``global_batch_info``.

    Without it each call normalises by its own micro-batch. With it the loss of a micro-batch is
    ``sum / batch_num_tokens * dp_size`` (token-mean) or ``sum / global_batch_size * dp_size`` (seq-mean-*), so
    summing the micro-batch losses of all ranks' mini-batch gives the mini-batch loss whatever the split.

    Attributes:
        batch_num_tokens: response tokens in the global mini-batch (int or 0-d tensor).
        global_batch_size: non-empty sequences in the global mini-batch (int or 0-d tensor).
        dp_size: data-parallel world size (gradients are averaged over it by FSDP).
        loss_scale_factor: constant divisor of ``seq-mean-token-sum-norm``; default the mask width.
    """

    batch_num_tokens: int | torch.Tensor | None = None
    global_batch_size: int | torch.Tensor | None = None
    dp_size: int = 1
    loss_scale_factor: int | float | None = None


def _check_mode(loss_agg_mode: str) -> None:
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; known modes: {', '.join(LOSS_AGG_MODES)}")


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    batch_info: GlobalBatchInfo | None = None,
) -> torch.Tensor:
    """Aggregate a ``[B, T]`` loss matrix to a scalar.

    * ``token-mean``: ``sum(L * m) / sum(m)``.
    * ``seq-mean-token-sum``: mean over non-empty sequences of ``sum_t(L * m)``.
    * ``seq-mean-token-mean``: mean over non-empty sequences of ``sum_t(L * m) / (n + 1e-8)``.
    * ``seq-mean-token-sum-norm``: ``sum(L * m) / T`` (``T`` the mask width, not divided by the batch size).

    Deviation from verl, documented: when this micro-batch has no token / no non-empty sequence and no
    ``batch_info`` is given, verl divides 0 by 0 (NaN); we divide by 1 and return 0, so an empty micro-batch
    contributes nothing instead of poisoning the step. Any other input gives verl's number.
    """
    _check_mode(loss_agg_mode)
    info = batch_info or GlobalBatchInfo()
    dtype = compute_dtype(loss_mat)
    mask = loss_mask.to(dtype)
    if loss_agg_mode == "token-mean":
        denom = info.batch_num_tokens if info.batch_num_tokens is not None else mask.sum().clamp(min=1.0)
        return masked_sum(loss_mat, loss_mask) / denom * info.dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        scale = info.loss_scale_factor if info.loss_scale_factor is not None else loss_mask.shape[-1]
        return masked_sum(loss_mat, loss_mask) / scale
    counts = mask.sum(dim=-1)
    seq_losses = masked_sum(loss_mat, loss_mask, axis=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_losses / (counts + 1e-8)
    seq_mask = (counts > 0).to(dtype)
    denom = info.global_batch_size if info.global_batch_size is not None else seq_mask.sum().clamp(min=1.0)
    return masked_sum(seq_losses, seq_mask) / denom * info.dp_size


def policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio: float | None,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    *,
    batch_info: GlobalBatchInfo | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """PPO clipped surrogate with asymmetric clipping and dual clip (verl's ``vanilla`` policy loss).

    ``ratio = exp(clamp(logp - old_logp, -20, 20))``; ``L1 = -A * ratio``;
    ``L2 = -A * clamp(ratio, 1 - clip_low, 1 + clip_high)``; ``Lc = max(L1, L2)``; where ``A < 0`` the dual clip
    bounds the loss: ``min(Lc, -A * clip_ratio_c)``. ``clip_ratio_low/high`` default to ``clip_ratio``.

    Args:
        old_log_prob, log_prob: ``[B, T]`` log-probs of the sampled tokens (rollout policy, current policy).
        advantages: ``[B, T]``.
        response_mask: ``[B, T]``.
        clip_ratio: symmetric clip epsilon (may be None when both sides are given).
        clip_ratio_c: dual-clip bound, must be > 1.
        loss_agg_mode: see :func:`agg_loss`.
        rollout_is_weights: ``[B, T]`` rollout-correction weights multiplying each token's loss before aggregation
            (verl's ``compute_policy_loss_vanilla``); the metrics do not see them.

    Returns:
        ``loss`` (0-d, with graph) and detached 0-d metrics: ``pg_clipfrac`` = masked mean of ``L2 > L1``,
        ``pg_clipfrac_lower`` = masked mean of ``(Lc > -A*c) & (A < 0)``, ``ppo_kl`` = masked mean of the clamped
        ``old_logp - logp`` (always token-mean).
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1.0 (the dual-clip lower bound of the ratio), got {clip_ratio_c}")
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    if low is None or high is None:
        raise ValueError("policy_loss: clip_ratio is None, so both clip_ratio_low and clip_ratio_high must be given")
    _check_mode(loss_agg_mode)
    dtype = compute_dtype(old_log_prob, log_prob, advantages)
    adv = advantages.to(dtype)

    # Upcast before subtracting: bf16 log-probs differ in their low bits, and exp magnifies the error.
    log_ratio = torch.clamp(log_prob.to(dtype) - old_log_prob.to(dtype), min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    losses1 = -adv * ratio
    losses2 = -adv * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    clipped1 = torch.maximum(losses1, losses2)
    losses3 = -adv * clip_ratio_c
    negative = adv < 0
    pg_losses = torch.where(negative, torch.minimum(losses3, clipped1), clipped1)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.to(dtype)
    loss = agg_loss(pg_losses, response_mask, loss_agg_mode, batch_info=batch_info)

    with torch.no_grad():
        pg_clipfrac = masked_mean((losses2 > losses1).to(dtype), response_mask)
        pg_clipfrac_lower = masked_mean(((clipped1 > losses3) & negative).to(dtype), response_mask)
        ppo_kl = masked_mean(-log_ratio.detach(), response_mask)
    return {"loss": loss, "pg_clipfrac": pg_clipfrac, "pg_clipfrac_lower": pg_clipfrac_lower, "ppo_kl": ppo_kl}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    *,
    batch_info: GlobalBatchInfo | None = None,
) -> dict[str, torch.Tensor]:
    """Clipped value loss: ``0.5 * agg(max((v - R)^2, (v_clip - R)^2))``, ``v_clip = clamp(v, v_old ± eps)``.

    Args:
        values: ``[B, T]`` current critic predictions (with graph).
        old_values: ``[B, T]`` critic values at rollout time.
        returns: ``[B, T]`` targets.
        response_mask: ``[B, T]``.
        cliprange_value: ``eps`` (verl's default 0.5).

    Returns:
        ``loss`` (0-d, with graph; the 0.5 is outside the aggregation) and ``vf_clipfrac`` (detached masked mean of
        ``(v_clip - R)^2 > (v - R)^2``).
    """
    _check_mode(loss_agg_mode)
    dtype = compute_dtype(values, old_values, returns)
    v = values.to(dtype)
    v_old = old_values.to(dtype)
    ret = returns.to(dtype)
    # min then max, like verl's clip_by_value: with a negative eps the upper bound wins.
    v_clipped = torch.maximum(torch.minimum(v, v_old + cliprange_value), v_old - cliprange_value)
    losses1 = (v - ret) ** 2
    losses2 = (v_clipped - ret) ** 2
    loss = 0.5 * agg_loss(torch.maximum(losses1, losses2), response_mask, loss_agg_mode, batch_info=batch_info)
    with torch.no_grad():
        vf_clipfrac = masked_mean((losses2 > losses1).to(dtype), response_mask)
    return {"loss": loss, "vf_clipfrac": vf_clipfrac}


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dimension: ``logsumexp(z) - sum(softmax(z) * z)``.

    Args:
        logits: ``[..., vocab]``; bf16/fp16 are computed in float32 (the subtraction cancels heavily).

    Returns:
        ``[...]`` entropies in the compute dtype.
    """
    z = logits.to(compute_dtype(logits))
    lse = torch.logsumexp(z, dim=-1)
    p = torch.softmax(z, dim=-1)
    return lse - torch.sum(p * z, dim=-1)


# entropy_metric's chunks: about this many logits each (64 MiB of float32 per temporary), and never fewer rows than
# ENTROPY_MIN_ROWS. torch's CPU reductions over the last dimension reduce each row in one thread, in the same order,
# as long as there are at least as many rows as threads; with fewer (one row, or a remainder of two) they split the
# row itself across threads and the last bit can change. Chunks of at least this many rows keep the values equal.
ENTROPY_CHUNK_ELEMENTS = 1 << 24
ENTROPY_MIN_ROWS = 256


def _entropy_blocks(batch: int, length: int, rows: int) -> list[tuple[slice, slice]]:
    """(batch, token) slices that tile a ``[batch, length]`` grid in order, each block at least ``min(batch * length,
    rows)`` cells: whole sequences grouped when they are short, each sequence split evenly along its tokens when
    it alone has ``rows`` or more (an even split leaves no short remainder)."""
    if batch * length <= rows:
        return [(slice(0, batch), slice(0, length))]
    if length >= rows:
        n = length // rows
        bounds = [length * i // n for i in range(n + 1)]
        return [(slice(b, b + 1), slice(lo, hi)) for b in range(batch) for lo, hi in zip(bounds, bounds[1:])]
    n = max(1, batch // -(-rows // length))  # as many groups as there are full groups of enough sequences
    bounds = [batch * i // n for i in range(n + 1)]
    return [(slice(lo, hi), slice(0, length)) for lo, hi in zip(bounds, bounds[1:])]


def entropy_metric(logits: torch.Tensor, *, chunk_elements: int | None = None) -> torch.Tensor:
    """:func:`entropy_from_logits` for a metric: no autograd graph, computed block by block.

    The graph of :func:`entropy_from_logits` keeps a float32 softmax the size of the logits until backward, and its
    forward makes two such temporaries; here each block's temporaries are freed before the next block, so the extra
    memory is a few buffers of ``chunk_elements`` logits (default :data:`ENTROPY_CHUNK_ELEMENTS`) whatever the batch.
    On CPU the values are bit-identical to :func:`entropy_from_logits` (tests/unit/test_entropy_metric.py); on CUDA
    the reduction kernel's split across thread blocks depends on the number of rows, so the last bit may differ.

    Args:
        logits: ``[B, T, vocab]`` (or ``[N, vocab]``); any dtype, like :func:`entropy_from_logits`.

    Returns:
        ``[B, T]`` (or ``[N]``) entropies in the compute dtype, detached.
    """
    if logits.dim() not in (2, 3):
        raise ValueError(f"logits must be [B, T, vocab] or [N, vocab], got shape {tuple(logits.shape)}")
    flat = logits.dim() == 2
    x = logits.unsqueeze(0) if flat else logits
    budget = ENTROPY_CHUNK_ELEMENTS if chunk_elements is None else chunk_elements
    rows = max(ENTROPY_MIN_ROWS, torch.get_num_threads(), budget // max(1, x.shape[-1]))
    with torch.no_grad():
        out = torch.empty(x.shape[:-1], dtype=compute_dtype(logits), device=logits.device)
        for bs, ts in _entropy_blocks(x.shape[0], x.shape[1], rows):
            out[bs, ts] = entropy_from_logits(x[bs, ts])
    return out[0] if flat else out


def entropy_loss(
    logits: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    batch_info: GlobalBatchInfo | None = None,
) -> torch.Tensor:
    """Aggregated token entropy of ``logits`` ``[B, T, vocab]`` over ``response_mask`` ``[B, T]`` (0-d, with graph)."""
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode, batch_info=batch_info)
