"""Rollout correction with verl's semantics: importance-sampling weights and rejection for the gap between the policy
that sampled (the rollout engine: bf16 vLLM, stale weights) and the one that trains (verl b178a3c,
``verl/trainer/ppo/rollout_corr_helper.py``; "When Speed Kills Stability", Liu, Li et al. 2025).

    weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob, rollout_log_prob, response_mask, rollout_is="token", rollout_is_threshold=2.0,
        rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01)

* **IS weights** ``pi_train / pi_rollout`` = ``exp(old_log_prob - rollout_log_prob)`` per token (``token``) or its
  product over the sequence (``sequence``), the log clamped to +-20, zero on padding, truncated at
  ``rollout_is_threshold`` (no lower truncation), detached; optionally divided by their mean over the batch
  (``rollout_is_batch_normalize``).
* **Rejection** (``rollout_rs``, comma-separated options all of which must pass) zeroes tokens or whole sequences of
  the response mask where a divergence estimate of ``log r`` (k1 = ``-log r`` with ratio bounds, k2 = ``(log r)^2 /
  2``, k3 = ``r - 1 - log r``; per token, or the sum, mean or max over the sequence) leaves its threshold: rejected
  tokens leave every loss denominator (verl's ``modified_response_mask``).
* **Metrics** ``rollout_corr/*`` (names: :func:`hpcppo.rollout_corr.metric_names`) as 0-d tensors: no ``.item()``
  (verl reads each one to the host); the caller converts them when it logs.

Batch normalisation: verl averages over the whole batch (``distributed_masked_mean`` over all ranks when
``torch.distributed`` is up). This module never talks to other ranks: ``all_reduce_sum`` (a function summing a
tensor over ranks, in place or not, returning the sum) is the caller's; without it the mean is over the tensors given.

Deviations, documented: verl raises on an all-zero response mask; here that check runs only when the mask is on the
CPU (reading it costs no device sync), as :mod:`hpcppo.algos.stats` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hpcppo import rollout_corr
from hpcppo.algos.stats import masked_mean, masked_sum

__all__ = ["SAFETY_BOUND", "AllReduce", "RolloutCorrectionParams", "compute_rollout_correction_and_rejection_mask",
           "compute_rollout_correction_weights",
           "compute_rollout_rejection_mask", "compute_offpolicy_metrics", "compute_is_metrics", "compute_rs_metrics"]

SAFETY_BOUND = 20.0  # exp(+-20) bounds every ratio (verl's SAFETY_BOUND)
Metrics = dict[str, torch.Tensor]
AllReduce = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class RolloutCorrectionParams:
    """verl's ``RolloutCorrectionConfig`` (``verl/trainer/config/algorithm.py``) as plain values, with the defaults
    of its YAML (``algorithm/rollout_correction.yaml``: everything off)."""

    rollout_is: str | None = None
    rollout_is_threshold: float | None = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: str | float | None = None
    bypass_mode: bool = False
    loss_type: str = "ppo_clip"


def _check_mask(response_mask: torch.Tensor) -> None:
    if response_mask.device.type == "cpu" and not bool(response_mask.any()):
        raise ValueError("response_mask must contain at least one valid token (1)")


def _log32(x: float, like: torch.Tensor) -> torch.Tensor:
    """``log(x)`` computed in float32, as verl's ``torch.log(torch.tensor(x))``."""
    return torch.log(torch.tensor(x, dtype=torch.float32, device=like.device))


def _masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x.masked_fill(~mask.bool(), float("-inf")).max()


def _masked_min(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x.masked_fill(~mask.bool(), float("inf")).min()


def _seq_stats(values: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """mean, unbiased std (0 for one value), max, min of ``values[valid]`` without indexing by a host-read mask."""
    v = valid.to(values.dtype)
    n = v.sum()
    mean = (values * v).sum() / n.clamp(min=1)
    var = (((values - mean) ** 2) * v).sum() / (n - 1).clamp(min=1)
    std = torch.where(n > 1, var.sqrt(), torch.zeros_like(var))
    return mean, std, _masked_max(values, valid), _masked_min(values, valid)


def _clamped_std(stat: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """verl's std of ``stat`` clamped to ``[low, high]``: ``sqrt(max(E[s^2] - E[s]^2, 0))``; 0 for a single token."""
    s = stat.clamp(min=low, max=high)
    var = masked_mean(s.square(), mask) - masked_mean(s, mask).square()
    std = torch.sqrt(torch.clamp(var, min=0.0))
    return torch.where(mask.sum() > 1, std, torch.zeros_like(std))


def compute_is_metrics(rollout_is_weights: torch.Tensor, log_ratio_for_metrics: torch.Tensor,
                       response_mask: torch.Tensor, rollout_is: str, rollout_is_threshold: float) -> Metrics:
    """verl's ``compute_is_metrics`` on the weights before truncation (safety-bounded, zero on padding): mean, max,
    min, the shares above the threshold and below its reciprocal, the std and effective sample size of the weights
    clamped to ``[1/threshold, threshold]``, and per-sequence statistics of each sequence's mean weight."""
    _check_mask(response_mask)
    w = rollout_is_weights
    lower = 1.0 / rollout_is_threshold
    m: Metrics = {}
    if rollout_is == "sequence":
        lr = log_ratio_for_metrics
        m["rollout_is_max"] = torch.exp(torch.clamp(lr.max(), max=SAFETY_BOUND))
        m["rollout_is_min"] = torch.exp(lr.min())
        m["rollout_is_mean"] = masked_mean(w, response_mask)
        # verl compares in log space with float32 logs of the thresholds
        m["rollout_is_ratio_fraction_high"] = (lr > _log32(rollout_is_threshold, lr)).float().mean()
        m["rollout_is_ratio_fraction_low"] = (lr < _log32(lower, lr)).float().mean()
    else:
        m["rollout_is_mean"] = masked_mean(w, response_mask)
        m["rollout_is_ratio_fraction_high"] = masked_mean((w > rollout_is_threshold).float(), response_mask)
        m["rollout_is_ratio_fraction_low"] = masked_mean((w < lower).float(), response_mask)
        m["rollout_is_max"] = _masked_max(w, response_mask)
        m["rollout_is_min"] = _masked_min(w, response_mask)
    m["rollout_is_std"] = _clamped_std(w, response_mask, lower, rollout_is_threshold)
    ess_w = w.clamp(min=lower, max=rollout_is_threshold)
    normalized = ess_w / (masked_mean(ess_w, response_mask) + 1e-8)
    m["rollout_is_eff_sample_size"] = 1.0 / masked_mean(normalized.square(), response_mask)
    seq = masked_mean(w, response_mask, axis=-1)  # every row, empty ones (0) included, as verl
    everyone = torch.ones_like(seq, dtype=torch.bool)
    mean, std, high, low = _seq_stats(seq, everyone)
    m |= {"rollout_is_seq_mean": mean, "rollout_is_seq_std": std, "rollout_is_seq_max": high, "rollout_is_seq_min": low,
          "rollout_is_seq_max_deviation": (seq - 1.0).abs().max(),
          "rollout_is_seq_fraction_high": (seq > rollout_is_threshold).float().mean(),
          "rollout_is_seq_fraction_low": (seq < lower).float().mean()}
    return m


def compute_rollout_correction_weights(log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_is: str = "token",
                                       rollout_is_threshold: float = 2.0, rollout_is_batch_normalize: bool = False,
                                       *, all_reduce_sum: AllReduce | None = None) -> tuple[torch.Tensor, Metrics]:
    """verl's ``compute_rollout_correction_weights``: truncated IS weights ``[B, T]`` from ``log_ratio = log pi_train
    - log pi_rollout`` at level ``token`` or ``sequence``, and their metrics (unprefixed). With
    ``rollout_is_batch_normalize`` the weights are divided by their mean (over tokens, or over non-empty sequences of
    each one's mean weight) when it exceeds 1e-8, and ``rollout_is_batch_norm_factor`` is that mean (else 1)."""
    if rollout_is not in rollout_corr.IS_LEVELS:
        raise ValueError(f"rollout_is must be one of {', '.join(rollout_corr.IS_LEVELS)}, got {rollout_is!r}")
    if not rollout_is_threshold > 0:
        raise ValueError(f"rollout_is_threshold must be positive, got {rollout_is_threshold}")
    if rollout_is == "token":
        for_metrics = log_ratio
        weights = torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND))
    else:
        for_metrics = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1).to(log_ratio.dtype)
        weights = torch.exp(torch.clamp(for_metrics, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(log_ratio)
    weights = weights * response_mask
    metrics = compute_is_metrics(weights, for_metrics, response_mask, rollout_is, rollout_is_threshold)
    weights = weights.clamp(max=rollout_is_threshold).detach()
    if rollout_is_batch_normalize:
        mask = response_mask.to(weights.dtype)
        if rollout_is == "token":
            values, valid = weights, mask
        else:
            values = masked_mean(weights, response_mask, axis=-1)
            valid = (response_mask.sum(dim=-1) > 0).to(weights.dtype)
        if all_reduce_sum is not None:  # verl's distributed_masked_mean: no epsilon
            mean = all_reduce_sum((values * valid).sum()) / all_reduce_sum(valid.sum())
        elif rollout_is == "token":
            mean = masked_mean(values, valid)
        else:
            mean = (values * valid).sum() / valid.sum().clamp(min=1e-8)
        use = mean > 1e-8
        weights = torch.where(use, weights / mean, weights)
        metrics["rollout_is_batch_norm_factor"] = torch.where(use, mean, torch.ones_like(mean))
    return weights, metrics


def compute_rs_metrics(option_name: str, rs_statistic: torch.Tensor, response_mask: torch.Tensor,
                       seq_valid_mask: torch.Tensor, *, level: str, per_sequence_values: torch.Tensor | None,
                       rollout_rs_threshold: float, rollout_rs_threshold_lower: float,
                       apply_lower_threshold: bool) -> Metrics:
    """verl's ``compute_rs_metrics`` for one option: the statistic's token mean, max/min and the shares beyond the
    thresholds (over sequences for sequence options), its clamped std, and per-sequence summaries."""
    _check_mask(response_mask)
    p = f"rollout_rs_{option_name}"
    seq = per_sequence_values if per_sequence_values is not None else masked_mean(rs_statistic, response_mask, axis=-1)
    seq = seq.reshape(seq.shape[0])
    v = seq_valid_mask.to(seq.dtype)
    n_seq = v.sum().clamp(min=1)
    m: Metrics = {f"{p}_mean": masked_mean(rs_statistic, response_mask)}
    high, low = rollout_rs_threshold, rollout_rs_threshold_lower
    if level == "sequence":
        m[f"{p}_max"], m[f"{p}_min"] = _masked_max(seq, seq_valid_mask), _masked_min(seq, seq_valid_mask)
        m[f"{p}_fraction_high"] = ((seq > high).to(seq.dtype) * v).sum() / n_seq
        m[f"{p}_fraction_low"] = (((seq < low).to(seq.dtype) * v).sum() / n_seq if apply_lower_threshold
                                  else torch.zeros((), device=seq.device))
    else:
        m[f"{p}_max"] = _masked_max(rs_statistic, response_mask)
        m[f"{p}_min"] = _masked_min(rs_statistic, response_mask)
        m[f"{p}_fraction_high"] = masked_mean((rs_statistic > high).float(), response_mask)
        m[f"{p}_fraction_low"] = (masked_mean((rs_statistic < low).float(), response_mask) if apply_lower_threshold
                                  else torch.zeros((), device=seq.device))
    m[f"{p}_std"] = _clamped_std(rs_statistic, response_mask, low if apply_lower_threshold else 0.0, high)
    mean, std, smax, smin = _seq_stats(seq, seq_valid_mask)
    m |= {f"{p}_seq_mean": mean, f"{p}_seq_std": std, f"{p}_seq_max": smax, f"{p}_seq_min": smin,
          f"{p}_seq_max_deviation": _masked_max(seq.abs(), seq_valid_mask),
          f"{p}_seq_fraction_high": ((seq > high).to(seq.dtype) * v).sum() / n_seq}
    if apply_lower_threshold:
        m[f"{p}_seq_fraction_low"] = ((seq < low).to(seq.dtype) * v).sum() / n_seq
    return m


def _rs_statistic(option: str, token_stats: dict[str, torch.Tensor], response_mask: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(per-token statistic, per-sequence statistic or None) of one rejection option."""
    tok = token_stats[option[-2:]]
    if option in rollout_corr.TOKEN_RS_OPTIONS:
        return tok, None
    if option.startswith("seq_sum"):
        seq = masked_sum(tok, response_mask, axis=-1).to(tok.dtype)
    elif option.startswith("seq_mean"):
        seq = masked_mean(tok, response_mask, axis=-1).to(tok.dtype)
    else:  # seq_max: an empty row's max is 0, as verl's _sequence_max
        seq = tok.masked_fill(~response_mask.bool(), float("-inf")).max(dim=-1).values
        seq = torch.where(torch.isneginf(seq), torch.zeros_like(seq), seq)
    return seq.unsqueeze(-1).expand_as(tok), seq


def compute_rollout_rejection_mask(log_ratio: torch.Tensor, response_mask: torch.Tensor,
                                   rollout_rs: str = "token_k1",
                                   rollout_rs_threshold: str | float | None = None) -> tuple[torch.Tensor, Metrics]:
    """verl's ``compute_rollout_rejection_mask``: the response mask with every token (``token_*``) or sequence
    (``seq_*``) that fails one of the ``rollout_rs`` options zeroed, and the metrics (unprefixed)."""
    options = rollout_corr.parse_rollout_rs(rollout_rs)
    thresholds = rollout_corr.parse_rollout_rs_thresholds(options, rollout_rs_threshold)
    if log_ratio.shape[0] == 0:
        return response_mask, {}
    safe = torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND)
    token_stats = {"k1": -safe, "k2": 0.5 * safe**2, "k3": torch.exp(safe) - 1.0 - safe}
    mask_bool = response_mask.bool()
    seq_valid = response_mask.sum(dim=-1) > 0
    seq_valid_f = seq_valid.to(log_ratio.dtype)
    combined = torch.ones_like(response_mask, dtype=log_ratio.dtype)
    metrics: Metrics = {}
    for option in options:
        lower, upper = thresholds[option]
        k1 = option.endswith("k1")
        stat, seq_stat = _rs_statistic(option, token_stats, response_mask)
        if k1:
            assert lower is not None
            low_log, high_log = math.log(lower), math.log(upper)
            keep = (stat >= low_log) & (stat <= high_log)
        else:
            keep = stat <= upper
        level = "token" if option in rollout_corr.TOKEN_RS_OPTIONS else "sequence"
        metrics |= compute_rs_metrics(option, stat, response_mask, seq_valid, level=level,
                                      per_sequence_values=seq_stat,
                                      rollout_rs_threshold=high_log if k1 else upper,
                                      rollout_rs_threshold_lower=low_log if k1 else 0.0, apply_lower_threshold=k1)
        keep_f = keep.to(log_ratio.dtype)
        combined = combined * keep_f
        seq_keep = (~((~keep) & mask_bool)).all(dim=-1).to(log_ratio.dtype)
        metrics[f"rollout_rs_{option}_masked_fraction"] = masked_mean(1 - keep_f, response_mask)
        metrics[f"rollout_rs_{option}_seq_masked_fraction"] = (
            ((1.0 - seq_keep) * seq_valid_f).sum() / seq_valid_f.sum().clamp(min=1))
    metrics["rollout_rs_masked_fraction"] = masked_mean(1 - combined, response_mask)
    final_keep = (combined > 0.5) & mask_bool
    metrics["rollout_rs_seq_masked_fraction"] = (~final_keep & mask_bool).any(dim=-1).float().mean()
    return (response_mask * combined).to(dtype=response_mask.dtype), metrics


def compute_offpolicy_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None,
                              response_mask: torch.Tensor) -> Metrics:
    """verl's ``compute_offpolicy_metrics``: the perplexities of both policies (batch means of each sequence's),
    ``kl`` = mean of ``rollout - old`` (KL(pi_rollout || pi_train)), ``k3_kl``, the log-perplexity differences, their
    ratio, and the chi-square divergences of the token and sequence ratios (unprefixed)."""
    _check_mask(response_mask)
    mean_train = masked_mean(old_log_prob, response_mask, axis=-1)
    m: Metrics = {"training_ppl": torch.exp(-mean_train).mean(), "training_log_ppl": (-mean_train).mean()}
    if rollout_log_prob is None:
        return m
    log_ratio = old_log_prob - rollout_log_prob
    m["kl"] = masked_mean(rollout_log_prob - old_log_prob, response_mask)
    m["k3_kl"] = masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask)
    mean_rollout = masked_mean(rollout_log_prob, response_mask, axis=-1)
    m["rollout_ppl"] = torch.exp(-mean_rollout).mean()
    m["rollout_log_ppl"] = (-mean_rollout).mean()
    diff = mean_rollout - mean_train
    m |= {"log_ppl_diff": diff.mean(), "log_ppl_abs_diff": diff.abs().mean(), "log_ppl_diff_max": diff.max(),
          "log_ppl_diff_min": diff.min(), "ppl_ratio": torch.exp(diff).mean()}
    rho = torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND))
    m["chi2_token"] = masked_mean(rho.square(), response_mask) - 1.0
    seq_sum = torch.clamp(masked_sum(log_ratio, response_mask, axis=-1), min=-SAFETY_BOUND, max=SAFETY_BOUND)
    m["chi2_seq"] = torch.exp(2.0 * seq_sum).mean() - 1.0
    return m


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: float | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
    *,
    all_reduce_sum: AllReduce | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, Metrics]:
    """verl's function of the same name: ``(rollout_is_weights or None, modified_response_mask, metrics)``.

    Args:
        old_log_prob: ``[B, T]`` log-probs of the training policy (verl's ``old_log_probs``; in bypass mode the
            current policy's).
        rollout_log_prob: ``[B, T]`` the engine's log-probs of the same tokens.
        response_mask: ``[B, T]``.
        rollout_is: ``"token"``, ``"sequence"`` or None (no weights; also None when ``rollout_is_threshold`` is).
        rollout_is_threshold: the truncation of the weights.
        rollout_is_batch_normalize: divide the weights by their batch mean.
        rollout_rs: comma-separated rejection options, or None.
        rollout_rs_threshold: their thresholds (see :func:`hpcppo.rollout_corr.parse_rollout_rs_thresholds`).
        all_reduce_sum: sums a tensor over the ranks whose rows make the batch (batch normalisation); None = this
            call's rows are the whole batch.

    Returns:
        The weights (``[B, T]``, detached, zero on padding) or None, the response mask with the rejected tokens
        zeroed (its dtype), and the metrics keyed ``rollout_corr/<name>`` (0-d tensors).
    """
    _check_mask(response_mask)
    if old_log_prob.shape != rollout_log_prob.shape:
        raise ValueError(f"old_log_prob shape {tuple(old_log_prob.shape)} does not match rollout_log_prob shape "
                         f"{tuple(rollout_log_prob.shape)}")
    if old_log_prob.shape != response_mask.shape:
        raise ValueError(f"log_prob shape {tuple(old_log_prob.shape)} does not match response_mask shape "
                         f"{tuple(response_mask.shape)}")
    log_ratio = old_log_prob - rollout_log_prob
    metrics: Metrics = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize,
            all_reduce_sum=all_reduce_sum)
        metrics |= is_metrics
    modified = response_mask.clone()
    if rollout_rs is not None:
        if rollout_rs_threshold is None:
            raise ValueError("rollout_rs_threshold must be given when rollout_rs is set")
        modified, rs_metrics = compute_rollout_rejection_mask(log_ratio, response_mask, rollout_rs,
                                                              rollout_rs_threshold)
        metrics |= rs_metrics
    metrics |= compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask)
    return weights, modified, {rollout_corr.PREFIX + k: v.detach() for k, v in metrics.items()}
