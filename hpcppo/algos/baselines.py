"""More of verl's group estimators (verl b178a3c, ``verl/trainer/ppo/core_algos.py``), vectorised over groups:
OPO's length-weighted baseline, GRPO pass@k, and the optimal token baselines (per-step baselines weighted by a
cumulative path-variance proxy, plain and for tool-interleaved responses).

Shapes and conventions as :mod:`hpcppo.algos.advantages` (``index``: one group id per row; returns
``(advantages, returns)``, ``[B, T]``, no gradients). Argument names are verl's.
"""

from __future__ import annotations

import torch

from hpcppo.algos.advantages import GroupIndex, _check_shapes, _group_stats, _group_sum, _outcome_scores, group_ids
from hpcppo.algos.stats import compute_dtype

__all__ = ["opo_advantage", "grpo_passk_advantage", "optimal_token_baseline_advantage",
           "tir_optimal_token_baseline_advantage"]


def _group_max(x: torch.Tensor, gid: torch.Tensor) -> torch.Tensor:
    """Per-group maxima of a ``[batch]`` tensor, indexed by group slot (unused slots -inf)."""
    return torch.full_like(x, float("-inf")).scatter_reduce_(0, gid, x, "amax")


@torch.no_grad()
def opo_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex,
                  epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (arXiv:2505.23585), verl's ``compute_opo_outcome_advantage``: ``s - b_g`` with the length-weighted group
    baseline ``b_g = sum(|y| s) / sum(|y|)`` (``|y|`` the response's tokens); a group of one keeps ``s``; broadcast over
    the mask. ``epsilon`` is unused, as in verl."""
    scores = _outcome_scores("opo_advantage", token_level_rewards, response_mask)
    gid = group_ids(index, scores.shape[0], scores.device)
    length = response_mask.to(scores.dtype).sum(dim=-1)
    count = _group_sum(torch.ones_like(scores), gid)[gid]
    baseline = _group_sum(length * scores, gid)[gid] / _group_sum(length, gid)[gid]
    adv = torch.where(count > 1, scores - baseline, scores)
    adv = adv.unsqueeze(-1) * response_mask.to(adv.dtype)
    return adv, adv


@torch.no_grad()
def grpo_passk_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex,
                         epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k (arXiv:2503.19595), verl's ``compute_grpo_passk_outcome_advantage``: in each group only the best
    response gets an advantage, ``r_max - r_second`` (divided by ``std_g + epsilon``, the unbiased group std, with
    ``norm_adv_by_std_in_grpo``); the others 0. A group needs two responses (``ValueError``, checked where the ids live
    on the host). Of tied best responses the first row wins (verl takes ``torch.topk``'s first index)."""
    scores = _outcome_scores("grpo_passk_advantage", token_level_rewards, response_mask)
    batch = scores.shape[0]
    gid = group_ids(index, batch, scores.device)
    count, _, std = _group_stats(scores, gid)
    if gid.device.type == "cpu" and batch and bool((count < 2).any()):
        raise ValueError("grpo_passk needs at least 2 responses per group (rollout.n >= 2)")
    best = _group_max(scores, gid)[gid]
    rows = torch.arange(batch, device=scores.device)
    first = torch.full_like(rows, batch).scatter_reduce_(0, gid, torch.where(scores == best, rows, batch), "amin")
    chosen = rows == first[gid]
    second = _group_max(torch.where(chosen, torch.full_like(scores, float("-inf")), scores), gid)[gid]
    adv = best - second
    if norm_adv_by_std_in_grpo:
        adv = adv / (std + epsilon)
    adv = torch.where(chosen, adv, torch.zeros_like(adv)).unsqueeze(-1) * response_mask.to(scores.dtype)
    return adv, adv


def _path_weights(old_log_probs: torch.Tensor, sum_pi_squared: torch.Tensor, rollout_is_weights: torch.Tensor | None,
                  mask: torch.Tensor) -> torch.Tensor:
    """``W_t = sum_{j<=t} (1 - 2 pi_j + sum pi^2) [x w_j^2]`` over the response tokens (verl's ``w_cumulative``)."""
    w = 1 - 2 * torch.exp(old_log_probs.to(mask.dtype)) + sum_pi_squared.to(mask.dtype)
    if rollout_is_weights is not None:
        w = w * rollout_is_weights.to(mask.dtype) ** 2
    return (w * mask).cumsum(dim=-1)


def _step_baselines(returns: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor, gid: torch.Tensor,
                    lengths: torch.Tensor, in_group: torch.Tensor, handle_zero_tail: bool,
                    epsilon: float) -> torch.Tensor:
    """Per group and step ``B_t = sum(G_t W_t m_t) / (sum(W_t m_t) + epsilon)``; 0 for a group of one; with
    ``handle_zero_tail`` 0 past the second-longest response on a group's unique longest one."""
    g = in_group.to(returns.dtype).unsqueeze(-1)
    num = _group_sum(returns * weights * mask * g, gid)[gid]
    den = _group_sum(weights * mask * g, gid)[gid] + epsilon
    count = _group_sum(in_group.to(returns.dtype), gid)[gid]
    baselines = torch.where((count > 1).unsqueeze(-1), num / den, torch.zeros_like(num))
    if handle_zero_tail:
        lens = torch.where(in_group, lengths, torch.full_like(lengths, -1.0))
        longest = _group_max(lens, gid)[gid]
        is_longest = in_group & (lens == longest)
        n_longest = _group_sum(is_longest.to(lens.dtype), gid)[gid]
        second = _group_max(torch.where(is_longest, torch.full_like(lens, -1.0), lens), gid)[gid]
        tail = is_longest & (n_longest == 1) & (count > 1) & (longest > second)
        cols = torch.arange(returns.shape[1], device=returns.device, dtype=lens.dtype)
        baselines = torch.where(tail.unsqueeze(-1) & (cols >= second.unsqueeze(-1)), 0.0, baselines)
    return baselines


@torch.no_grad()
def optimal_token_baseline_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                     index: GroupIndex, old_log_probs: torch.Tensor, sum_pi_squared: torch.Tensor,
                                     rollout_is_weights: torch.Tensor | None = None, handle_zero_tail: bool = False,
                                     epsilon: float = 1e-8) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``compute_optimal_token_baseline_advantage``: returns ``G_t`` = the reward-to-go of the masked rewards,
    advantages ``(G_t - B_t) m_t`` with the per-step group baseline ``B_t = sum G_t W_t / (sum W_t + epsilon)`` over
    the group's responses at step ``t``, ``W_t`` the cumulative ``1 - 2 pi + sum pi^2`` (``pi = exp(old_log_probs)``,
    ``sum_pi_squared`` the actor's ``sum_v pi_v^2``), each term times ``rollout_is_weights^2`` when given."""
    _check_shapes("optimal_token_baseline_advantage", token_level_rewards, response_mask=response_mask,
                  old_log_probs=old_log_probs, sum_pi_squared=sum_pi_squared, rollout_is_weights=rollout_is_weights)
    dtype = compute_dtype(token_level_rewards, old_log_probs, sum_pi_squared)
    mask = response_mask.to(dtype)
    returns = (token_level_rewards.to(dtype) * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    weights = _path_weights(old_log_probs, sum_pi_squared, rollout_is_weights, mask)
    gid = group_ids(index, returns.shape[0], returns.device)
    everyone = torch.ones(returns.shape[0], dtype=torch.bool, device=returns.device)
    baselines = _step_baselines(returns, weights, mask, gid, mask.sum(dim=-1), everyone, handle_zero_tail, epsilon)
    return (returns - baselines) * mask, returns


@torch.no_grad()
def tir_optimal_token_baseline_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                         index: GroupIndex, old_log_probs: torch.Tensor,
                                         sum_pi_squared: torch.Tensor, rollout_is_weights: torch.Tensor | None = None,
                                         handle_zero_tail: bool = True, epsilon: float = 1e-8
                                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``compute_multi_turn_optimal_token_baseline_advantage`` (``tir_optimal_token_baseline``): as
    :func:`optimal_token_baseline_advantage`, but steps count the policy's own tokens only (the mask's ones, tool
    output skipped): each response's masked positions are packed to the left, the baselines taken per packed step,
    and the advantages put back where the tokens were. Rows without a token join no group."""
    _check_shapes("tir_optimal_token_baseline_advantage", token_level_rewards, response_mask=response_mask,
                  old_log_probs=old_log_probs, sum_pi_squared=sum_pi_squared, rollout_is_weights=rollout_is_weights)
    dtype = compute_dtype(token_level_rewards, old_log_probs, sum_pi_squared)
    mask = response_mask.to(dtype)
    valid = response_mask.bool()
    returns = (token_level_rewards.to(dtype) * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    weights = _path_weights(old_log_probs, sum_pi_squared, rollout_is_weights, mask)
    # packed step of each masked token; unmasked ones are sent to a spare last column and dropped
    width = returns.shape[1]
    step = torch.where(valid, mask.cumsum(dim=-1).long() - 1, torch.full_like(valid, width, dtype=torch.long))

    def pack(x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape[0], width + 1, dtype=x.dtype, device=x.device)
        return out.scatter_(1, step, torch.where(valid, x, torch.zeros_like(x)))[:, :width]

    lengths = mask.sum(dim=-1)
    packed_mask = (torch.arange(width, device=mask.device, dtype=dtype) < lengths.unsqueeze(-1)).to(dtype)
    gid = group_ids(index, returns.shape[0], returns.device)
    packed_returns = pack(returns)
    baselines = _step_baselines(packed_returns, pack(weights), packed_mask, gid, lengths, lengths > 0,
                                handle_zero_tail, epsilon)
    packed_adv = torch.cat([packed_returns - baselines, torch.zeros_like(lengths).unsqueeze(-1)], dim=-1)
    return torch.gather(packed_adv, 1, step) * mask, returns
