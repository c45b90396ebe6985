"""Advantage estimators with verl's semantics (``verl/trainer/ppo/core_algos.py``), vectorised and sync-free.

Shapes: ``token_level_rewards``, ``values``, ``response_mask`` are ``[batch, response_len]``; ``index`` holds one
group id per sample (``batch`` entries: a list/tuple/NumPy array of hashables such as uid strings, or an integer
tensor). Every estimator returns ``(advantages, returns)``, both ``[batch, response_len]`` in the compute dtype
(float32, or float64 for float64 inputs), without gradients.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from hpcppo.algos.stats import compute_dtype, masked_whiten, reverse_linear_scan

__all__ = [
    "gae",
    "gpg_advantage",
    "group_ids",
    "grpo_advantage",
    "reinforce_pp_advantage",
    "reinforce_pp_baseline_advantage",
    "remax_advantage",
    "rloo_advantage",
]

GroupIndex = Sequence[Hashable] | torch.Tensor | Any  # Any: NumPy arrays without importing NumPy here


def _check_shapes(name: str, reference: torch.Tensor, **others: torch.Tensor | None) -> None:
    if reference.dim() != 2:
        raise ValueError(f"{name}: expected [batch, response_len] tensors, got shape {tuple(reference.shape)}")
    for key, t in others.items():
        if t is not None and t.shape != reference.shape:
            raise ValueError(
                f"{name}: {key} has shape {tuple(t.shape)}, expected {tuple(reference.shape)} like token_level_rewards"
            )


@torch.no_grad()
def gae(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation, skipping tokens outside the mask (multi-turn observations).

    verl's reverse loop is ``delta = r_t + gamma * nextv - v_t``, ``a_t = delta + gamma * lam * a_{t+1}``, where a
    position with ``mask_t = 0`` carries ``nextv`` and ``a`` over unchanged. Written as two linear recurrences:

    * ``nextv_t`` = the value at the next masked-in position after ``t`` (0 past the end);
    * ``a_t = mask_t * delta_t + (gamma * lam if mask_t else 1) * a_{t+1}``;

    each solved by :func:`reverse_linear_scan` in ``O(log T)`` kernel rounds instead of ``T``.

    Args:
        token_level_rewards: ``[B, T]`` rewards (KL penalty already applied).
        values: ``[B, T]`` critic values of the rollout.
        response_mask: ``[B, T]``.
        gamma, lam: Python floats (host configuration).

    Returns:
        ``advantages``: ``[B, T]`` raw advantages whitened over the whole masked batch;
        ``returns``: ``[B, T]`` raw advantages + values (not whitened).

    Raises:
        ValueError: shapes differ, or (on CPU) the mask selects fewer than two tokens, as in verl.
    """
    _check_shapes("gae", token_level_rewards, values=values, response_mask=response_mask)
    dtype = compute_dtype(token_level_rewards, values)
    gamma, lam = float(gamma), float(lam)
    m = response_mask.bool()
    zero = torch.zeros((), dtype=dtype, device=values.device)
    v = torch.where(m, values.to(dtype), zero)
    r = token_level_rewards.to(dtype)

    # Value at the next masked-in position, strictly after t: fill backwards, then shift left by one.
    filled = reverse_linear_scan(v, (~m).to(dtype))
    next_values = torch.cat([filled[:, 1:], torch.zeros_like(filled[:, :1])], dim=1)
    delta = torch.where(m, r + gamma * next_values - v, zero)
    discount = torch.full((), gamma * lam, dtype=dtype, device=v.device)
    coef = torch.where(m, discount, torch.ones((), dtype=dtype, device=v.device))
    raw = reverse_linear_scan(delta, coef)

    returns = raw + values.to(dtype)
    advantages = masked_whiten(raw, response_mask)
    return advantages, returns


def group_ids(index: GroupIndex, batch: int, device: torch.device) -> torch.Tensor:
    """Dense group ids ``[batch]`` (int64, values in ``[0, batch)``) on ``device``; equal labels share an id.

    Host labels (lists of strings, NumPy arrays) are mapped in Python, which is free since they live on the host,
    and copied with ``non_blocking=True``. An integer tensor is ranked on its own device by a stable sort, so a CUDA
    index needs no sync and no data-dependent shape (``torch.unique`` would need both).
    """
    if isinstance(index, torch.Tensor):
        if index.dim() != 1 or index.shape[0] != batch:
            raise ValueError(f"index: expected {batch} group ids, got a tensor of shape {tuple(index.shape)}")
        if index.is_floating_point() or index.is_complex():
            raise ValueError(f"index: group ids must be integers or hashable labels, got a {index.dtype} tensor")
        idx = index.to(torch.int64)
        sorted_ids, order = torch.sort(idx, stable=True)
        starts = torch.ones_like(sorted_ids, dtype=torch.bool)
        starts[1:] = sorted_ids[1:] != sorted_ids[:-1]
        rank = torch.cumsum(starts.to(torch.int64), dim=0) - 1
        dense = torch.empty_like(rank).scatter_(0, order, rank)
        # Host-to-device copies may be asynchronous; a device-to-host one must not be (the host reads it next).
        return dense.to(device, non_blocking=device.type != "cpu")
    labels = index.tolist() if hasattr(index, "tolist") else list(index)
    if len(labels) != batch:
        raise ValueError(f"index: expected {batch} group ids (one per sample), got {len(labels)}")
    mapping: dict[Hashable, int] = {}
    try:
        dense_list = [mapping.setdefault(label, len(mapping)) for label in labels]
    except TypeError as exc:  # unhashable label, e.g. a list
        raise ValueError(f"index: group ids must be hashable, got {exc}") from None
    return torch.tensor(dense_list, dtype=torch.int64).to(device, non_blocking=True)


def _group_sum(x: torch.Tensor, gid: torch.Tensor) -> torch.Tensor:
    """Per-group sums ``[batch]`` (slot ``g`` holds group ``g``'s sum; unused slots 0)."""
    return torch.zeros_like(x).index_add_(0, gid, x)


def _group_stats(scores: torch.Tensor, gid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group size ``n``, group mean and unbiased group std (two-pass), each ``[batch]``.

    The std of a group of one is NaN here; callers replace it as verl does.
    """
    count = _group_sum(torch.ones_like(scores), gid)[gid]
    mean = (_group_sum(scores, gid)[gid]) / count
    centered = scores - mean
    var = _group_sum(centered * centered, gid)[gid] / (count - 1)
    return count, mean, torch.sqrt(var)


def _outcome_scores(name: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    _check_shapes(name, token_level_rewards, response_mask=response_mask)
    # verl sums the whole row; rewards outside the mask are expected to be 0 and are summed as they are.
    return token_level_rewards.to(compute_dtype(token_level_rewards)).sum(dim=-1)


@torch.no_grad()
def grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: ``(s - mean_g) / (std_g + epsilon)`` (or ``s - mean_g``), broadcast over the mask.

    ``s`` is the row sum of the token rewards, ``std_g`` the unbiased std of the group; a group of one uses mean 0
    and std 1 (verl). Returns ``(advantages, advantages)``, each ``[B, T]``.
    """
    scores = _outcome_scores("grpo_advantage", token_level_rewards, response_mask)
    gid = group_ids(index, scores.shape[0], scores.device)
    count, mean, std = _group_stats(scores, gid)
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    if norm_adv_by_std:
        std = torch.where(single, torch.ones_like(std), std)
        adv = (scores - mean) / (std + epsilon)
    else:
        adv = scores - mean
    adv = adv.unsqueeze(-1) * response_mask.to(adv.dtype)
    return adv, adv


@torch.no_grad()
def rloo_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: ``s * n/(n-1) - mean_g * n/(n-1)`` (the leave-one-out baseline); a group of one keeps ``s``.

    Returns ``(advantages, advantages)``, each ``[B, T]``, zero outside the mask.
    """
    scores = _outcome_scores("rloo_advantage", token_level_rewards, response_mask)
    gid = group_ids(index, scores.shape[0], scores.device)
    count = _group_sum(torch.ones_like(scores), gid)[gid]
    mean = _group_sum(scores, gid)[gid] / count
    scale = count / (count - 1)
    adv = torch.where(count > 1, scores * scale - mean * scale, scores)
    adv = adv.unsqueeze(-1) * response_mask.to(adv.dtype)
    return adv, adv


@torch.no_grad()
def reinforce_pp_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return-to-go, reset after every masked-out token, whitened over the batch.

    verl's loop is ``G_t = r_t + gamma * G_{t+1} * mask_{t+1}``; ``returns`` are those ``G`` (all positions),
    ``advantages = masked_whiten(G, mask) * mask``.
    """
    _check_shapes("reinforce_pp_advantage", token_level_rewards, response_mask=response_mask)
    dtype = compute_dtype(token_level_rewards)
    r = token_level_rewards.to(dtype)
    m = response_mask.to(dtype)
    # The coefficient linking t to t + 1 is gamma * mask_{t+1}; the last one never matters (G_T = 0).
    coef = torch.cat([m[:, 1:], torch.zeros_like(m[:, :1])], dim=1) * float(gamma)
    returns = reverse_linear_scan(r, coef)
    advantages = masked_whiten(returns, response_mask) * m
    return advantages, returns


@torch.no_grad()
def reinforce_pp_baseline_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline: ``(s - mean_g)`` broadcast over the mask, whitened over the batch.

    A group of one uses mean 0. Returns ``(advantages, advantages)``, each ``[B, T]``.
    """
    scores = _outcome_scores("reinforce_pp_baseline_advantage", token_level_rewards, response_mask)
    gid = group_ids(index, scores.shape[0], scores.device)
    count = _group_sum(torch.ones_like(scores), gid)[gid]
    mean = _group_sum(scores, gid)[gid] / count
    centered = torch.where(count > 1, scores - mean, scores)
    m = response_mask.to(centered.dtype)
    tiled = centered.unsqueeze(-1) * m
    adv = masked_whiten(tiled, response_mask) * m
    return adv, adv


@torch.no_grad()
def remax_advantage(
    token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv:2310.10505): the return-to-go of the masked rewards minus the reward of the
    greedy response to the same prompt, ``returns_t = sum_{s>=t} r_s m_s``, ``adv_t = returns_t - b * m_t``
    (verl b178a3c, ``verl/trainer/ppo/core_algos.py``, ``compute_remax_outcome_advantage``).

    Args:
        token_level_rewards: ``[B, T]``.
        reward_baselines: ``[B]``, the score of the greedy response to each sample's prompt.
        response_mask: ``[B, T]``.

    Returns:
        ``(advantages, returns)``, each ``[B, T]``; not whitened (verl does not).
    """
    _check_shapes("remax_advantage", token_level_rewards, response_mask=response_mask)
    if reward_baselines.shape != token_level_rewards.shape[:1]:
        raise ValueError(f"remax_advantage: reward_baselines must be [{token_level_rewards.shape[0]}], got "
                         f"{tuple(reward_baselines.shape)}")
    dtype = compute_dtype(token_level_rewards, reward_baselines)
    mask = response_mask.to(dtype)
    returns = (token_level_rewards.to(dtype) * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = returns - reward_baselines.to(dtype).unsqueeze(-1) * mask
    return advantages, returns


@torch.no_grad()
def gpg_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex, f_norm: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (Chu et al. 2025, arXiv:2504.02546): ``alpha * (s - mean_g) / f_norm`` with ``alpha = B / max(1, number
    of non-zero scores in the batch)``, broadcast over the mask; a group of one uses mean 0 (verl b178a3c,
    ``verl/trainer/ppo/core_algos.py``, ``compute_gpg_outcome_advantage``: it computes each group's std and does not
    use it, and passes ``f_norm`` = 1).

    Returns ``(advantages, advantages)``, each ``[B, T]``.
    """
    scores = _outcome_scores("gpg_advantage", token_level_rewards, response_mask)
    gid = group_ids(index, scores.shape[0], scores.device)
    count = _group_sum(torch.ones_like(scores), gid)[gid]
    mean = torch.where(count == 1, torch.zeros_like(scores), _group_sum(scores, gid)[gid] / count)
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1).to(scores.dtype)
    adv = (alpha * (scores - mean) / f_norm).unsqueeze(-1) * response_mask.to(scores.dtype)
    return adv, adv
