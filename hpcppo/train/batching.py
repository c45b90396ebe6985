"""Batch plumbing of the trainer: building the training batch from a rollout, splitting it into mini-
and micro-batches, gathering the small per-token tensors across ranks, optimizer steps and metrics.

Batches are plain dicts of tensors (rows = samples) plus a few Python lists (``records``); the keys are
documented in :func:`to_training_batch`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hpcppo import algos
from hpcppo.distributed.env import all_reduce_host
from hpcppo.models import row_lengths, trimmed_columns


def to_training_batch(out: Any, prompts: Sequence[Any], device: torch.device) -> dict[str, Any]:
    """A rollout (``RolloutBatch``) and its prompts -> the trainer's batch on ``device``.

    Keys: ``input_ids``/``attention_mask``/``position_ids`` ``[b, P+R]`` (prompt then response),
    ``responses``/``response_mask``/``response_attention_mask``/``rollout_log_probs``/``policy_version`` ``[b, R]``,
    ``prompt_index`` ``[b]`` (dataset index of the prompt: GRPO/RLOO groups), ``prompt_len``/``seq_tokens`` ``[b]``,
    ``records`` (one per sample).

    The two masks (docs/rollout-phase.md, "Which consumer takes which mask"): ``response_attention_mask`` (every
    real response token; the response half of ``attention_mask``) is what the forwards, the packing, the position
    ids, the scoring (text, length, where the score lands) and the length metrics read; ``response_mask`` is the
    loss mask: losses, token-mean denominators, the KL penalty, advantages and whitening, the log-prob gap.
    """
    which = out.prompt_index.tolist()
    batch: dict[str, Any] = {
        "input_ids": out.input_ids.to(device),
        "attention_mask": out.attention_mask.to(device),
        "position_ids": out.position_ids.to(device),
        "responses": out.response_ids.to(device),
        "response_mask": out.response_mask.to(device),
        "response_attention_mask": out.response_attention_mask.to(device),
        "rollout_log_probs": out.rollout_log_probs.to(device).float(),
        "policy_version": out.policy_version.to(device),
        "prompt_index": torch.tensor([prompts[i].index for i in which], dtype=torch.long, device=device),
        "prompt_len": out.prompt_mask.sum(-1).to(device),
        "records": [prompts[i].record for i in which],
    }
    batch["seq_tokens"] = batch["attention_mask"].sum(-1)
    return batch


def tp_share(batch: Mapping[str, Any], tp_rank: int, tp_size: int) -> dict[str, Any]:
    """This rank's consecutive ``1/tp_size`` of the rows its tensor-parallel group generated together.

    The ranks of a rollout TP group submit the same prompts and receive the same batch; the update is data
    parallel over *all* ranks, so each keeps a distinct share (rank ``tp_rank`` of the group keeps slice
    ``tp_rank``). ``tp_size == 1`` returns the batch itself.
    """
    if tp_size == 1:
        return dict(batch)
    rows = batch["response_mask"].shape[0]
    if rows % tp_size:
        raise ValueError(f"{rows} rollout rows cannot be split over a tensor-parallel group of {tp_size}")
    share = rows // tp_size
    return {k: v[tp_rank * share: (tp_rank + 1) * share] for k, v in batch.items()}


def place_scores(scores: Sequence[float], attention: torch.Tensor) -> torch.Tensor:
    """``[b, R]`` token-level scores: each sequence's score on its last response token, counted on the response
    attention mask (verl's reward managers: ``valid_response_length`` from ``attention_mask``, the score at
    ``valid_response_length - 1``)."""
    out = torch.zeros(attention.shape, dtype=torch.float32, device=attention.device)
    last = (attention.sum(-1) - 1).clamp(min=0).long()
    out[torch.arange(len(scores), device=out.device), last] = torch.tensor(scores, dtype=torch.float32, device=out.device)
    return out * (attention.sum(-1, keepdim=True) > 0)


def split(batch: Mapping[str, Any], size: int) -> Iterator[dict[str, Any]]:
    """Consecutive row slices of ``size`` rows (the last may be shorter)."""
    n = batch["response_mask"].shape[0]
    for start in range(0, n, size):
        yield {k: v[start : start + size] for k, v in batch.items()}


def pack_rows(prompt_len: Sequence[int], response_len: Sequence[int], max_tokens: int,
              count: int | None = None, *, packed: bool = False) -> list[list[int]]:
    """Rows -> micro-batches (lists of row indices) of at most ``max_tokens`` tokens each, padding included.

    A micro-batch runs trimmed to its longest prompt and longest response (``hpcppo.models.trimmed_columns``), so it
    costs ``rows x (max prompt + max response)`` tokens; with ``packed`` (its rows packed into one sequence,
    ``hpcppo.models.forward_log_probs_packed``) the sum of its rows' tokens. Rows are taken longest first and cut
    into consecutive runs:
    rows of like length share a micro-batch, so little padding is left to compute. With ``count`` (at least the
    fewest micro-batches the budget allows, at most the number of rows) there are exactly that many, balanced: the
    smallest per-micro-batch limit that still needs no more than ``count`` of them, then the costliest split in
    two until there are ``count``.

    verl (``rearrange_micro_batches`` in verl/utils/seqlen_balancing.py at b178a3c) balances the sum of real tokens
    with Karmarkar-Karp partitions, which mixes long and short rows in each micro-batch: right where padding is
    removed (its ``use_remove_padding``), wasteful where it is not. Here every micro-batch keeps its padding, so rows
    are grouped by length and the budget bounds the padded tokens that run, never exceeded.
    """
    n = len(prompt_len)
    if n != len(response_len):
        raise ValueError(f"{n} prompt lengths but {len(response_len)} response lengths")
    width = [int(p) + int(r) for p, r in zip(prompt_len, response_len)]
    longest = max(width, default=0)
    if longest > max_tokens:
        raise ValueError(f"a row of {longest} tokens does not fit a micro-batch of {max_tokens} tokens")
    order = sorted(range(n), key=lambda i: (-width[i], -int(response_len[i]), i))

    def greedy(limit: int) -> list[list[int]]:
        groups: list[list[int]] = []
        top_p = top_r = 0
        for i in order:
            if packed:  # top_p counts the micro-batch's tokens
                p, r = top_p + width[i], 0
            else:
                p, r = max(top_p, int(prompt_len[i])), max(top_r, int(response_len[i]))
            if groups and (p + r if packed else (len(groups[-1]) + 1) * (p + r)) <= limit:
                groups[-1].append(i)
                top_p, top_r = p, r
            else:
                groups.append([i])
                top_p, top_r = (width[i], 0) if packed else (int(prompt_len[i]), int(response_len[i]))
        return groups

    groups = greedy(max_tokens)
    if count is None:
        return groups
    if not len(groups) <= count <= max(n, 1):
        raise ValueError(f"{n} rows cannot make {count} micro-batches of at most {max_tokens} tokens "
                         f"(between {len(groups)} and {n})")
    low, high = max(longest, 1), max_tokens  # greedy(high) needs <= count micro-batches; find the smallest limit
    while low < high:
        mid = (low + high) // 2
        if len(greedy(mid)) <= count:
            high = mid
        else:
            low = mid + 1
    groups = greedy(high)

    def cost(group: list[int]) -> int:
        return sum(width[i] for i in group) if packed else len(group) * max(width[i] for i in group)

    while len(groups) < count:
        at = max((k for k, g in enumerate(groups) if len(g) > 1), key=lambda k: cost(groups[k]))
        g = groups[at]
        groups[at: at + 1] = [g[: len(g) // 2], g[len(g) // 2:]]
    return groups


def token_budget_groups(attention_masks: Sequence[torch.Tensor], response_len: int, max_tokens: int, *,
                        packed: bool = False) -> list[list[torch.Tensor]]:
    """Micro-batches (row-index tensors) under ``max_tokens`` for each of several batches of this rank (the
    mini-batches of an update, or the one batch of the log-prob and value passes).

    Collective (one host all-reduce for all of them): every rank must run as many forwards and backwards per batch
    as the others (each is a round of FSDP all-gathers and, on the last, reduce-scatters), so each batch gets the
    largest count any rank needs, and every rank packs its rows into exactly that many (:func:`pack_rows`). Each
    rank holds as many rows as the others, so that count never exceeds a rank's rows. ``packed``: the micro-batches
    run without padding (:func:`pack_rows`).
    """
    lengths = []
    for mask in attention_masks:
        prompt, response = row_lengths(mask, response_len)
        lengths.append((prompt.tolist(), response.tolist()))
    fewest = [len(pack_rows(p, r, max_tokens, packed=packed)) for p, r in lengths]
    counts = [int(c) for c in all_reduce_host(fewest, "max")] if fewest else []
    device = attention_masks[0].device if attention_masks else None
    return [[torch.tensor(g, dtype=torch.long, device=device)
             for g in pack_rows(p, r, max_tokens, count, packed=packed)] for (p, r), count in zip(lengths, counts)]


def take_rows(batch: Mapping[str, Any], rows: torch.Tensor) -> dict[str, Any]:
    """The micro-batch of ``rows`` (indices), trimmed to its own columns (``hpcppo.models.trimmed_columns``):
    ``[b, P+R]`` tensors to its longest prompt and response, ``[b, R]`` tensors to its longest response, ``[b]``
    tensors and lists by row. A 2-D tensor of any other width is refused rather than guessed at."""
    seq_width = batch["input_ids"].shape[1]
    resp_width = batch["responses"].shape[1]
    cols, width = trimmed_columns(batch["attention_mask"][rows], resp_width)
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            out[key] = [value[i] for i in rows.tolist()]
            continue
        value = value[rows]
        if value.dim() >= 2 and value.shape[1] == seq_width:
            value = value[:, cols]
        elif value.dim() >= 2 and value.shape[1] == resp_width:
            value = value[:, :width]
        elif value.dim() >= 2:
            raise ValueError(f"batch key {key!r} is {tuple(value.shape)}: neither [b, {seq_width}] (prompt + "
                             f"response) nor [b, {resp_width}] (response)")
        out[key] = value
    return out


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def gather_rows(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """All-gather each tensor along rows (rank order); ``[b, R]`` tensors are right-padded with zeros to
    the widest rank's ``R`` first. Every rank holds the same number of rows."""
    world = _world()
    if world == 1:
        return {k: v for k, v in tensors.items()}
    widths = [v.shape[1] for v in tensors.values() if v.dim() == 2]
    width_max = int(all_reduce_host([max(widths) if widths else 0], "max")[0])
    out = {}
    for key, value in tensors.items():
        if value.dim() == 2 and value.shape[1] < width_max:
            value = F.pad(value, (0, width_max - value.shape[1]))
        value = value.contiguous()
        parts = [torch.empty_like(value) for _ in range(world)]
        dist.all_gather(parts, value)
        out[key] = torch.cat(parts, dim=0)
    return out


def local_rows(rows_per_rank: int, rank: int) -> slice:
    return slice(rank * rows_per_rank, (rank + 1) * rows_per_rank)


def global_batch_info(response_mask: torch.Tensor, dp_size: int, loss_scale_factor: int) -> algos.GlobalBatchInfo:
    """Token and sequence counts of the global mini-batch (one all-reduce), for exact loss normalisation."""
    counts = torch.stack([response_mask.sum(), (response_mask.sum(-1) > 0).sum()]).to(torch.float64)
    if dist.is_initialized():
        dist.all_reduce(counts)
    return algos.GlobalBatchInfo(batch_num_tokens=counts[0], global_batch_size=counts[1], dp_size=dp_size,
                                 loss_scale_factor=loss_scale_factor)


def set_last_micro_batch(model: nn.Module, last: bool) -> None:
    """Gradient accumulation that keeps gradients sharded: FSDP2 reduce-scatters every micro-batch's gradient into
    the sharded ``.grad`` (where it accumulates); under HSDP only the all-reduce across replicas waits for the last
    micro-batch of the mini-batch (FSDP2 keeps the partial, sharded sum until then). Plain FSDP ignores the flag.

    Not ``set_requires_gradient_sync(False)`` (FSDP1's ``no_sync``): with it FSDP2 keeps an *unsharded* gradient of
    every parameter until the synced backward (torch 2.13 ``FSDPParamGroup.post_backward``: ``if not
    self.reduce_grads`` leaves ``unsharded_param.grad`` / ``unsharded_accumulated_grad`` in place), i.e. the whole
    model's gradient on every rank — ~290 GB for a 72B actor. verl never turns the sync off for FSDP2 either.
    """
    fn = getattr(model, "set_requires_all_reduce", None)
    if fn is not None:
        fn(last)


def _to_float(t: torch.Tensor | float) -> float:
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return float(t)


def norm_device(total_norm: Any) -> torch.device | None:
    """Where a sharded total grad norm must be reduced: its mesh's device when the norm sits elsewhere, else None.

    With FSDP2 ``cpu_offload`` the gradients (and so the per-shard norm, a ``Partial`` DTensor) live in host memory
    while the mesh is a CUDA/NCCL one; reducing it there fails like any CPU tensor on an NCCL group. verl moves the
    norm to the GPU before clipping (``fsdp2_clip_grad_norm_`` in verl/utils/fsdp_utils.py); so do we.
    """
    mesh = getattr(total_norm, "device_mesh", None)
    if mesh is None or total_norm.device.type == mesh.device_type:
        return None
    if mesh.device_type == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` with the total norm reduced on the mesh's device (see :func:`norm_device`).

    The same two steps as torch's own function (``get_total_norm`` then ``clip_grads_with_norm_``,
    torch/nn/utils/clip_grad.py), so the numbers are identical where nothing moves.
    """
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads)
    device = norm_device(total)
    if device is not None:
        total = total.to(device)
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def clip_and_step(model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float) -> float:
    """Clip the global grad norm, step unless it is not finite (then skip, as verl does); zero the grads."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = _to_float(clip_grad_norm(params, max_norm)) if params else 0.0
    if math.isfinite(norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


class UpdateMetrics:
    """The metric samples of one actor or critic update, kept as device scalars until :meth:`reduce`.

    A ``float()`` per micro-batch would make the host wait for the device every time, so it could not queue the
    next micro-batch's work meanwhile; here there is one device-to-host copy per update. ``add(key, value,
    scale)`` records ``value * scale``, multiplied in Python after the copy, so the numbers are exactly those of
    ``float(value) * scale``.
    """

    def __init__(self) -> None:
        self._samples: dict[str, list[tuple[torch.Tensor | float, int]]] = {}

    def add(self, key: str, value: torch.Tensor | float, scale: int = 1) -> None:
        sample = value.detach() if isinstance(value, torch.Tensor) else float(value)
        self._samples.setdefault(key, []).append((sample, scale))

    def reduce(self) -> dict[str, float]:
        """Per-key local mean, then the mean over ranks (collective: every rank must have the same keys)."""
        tensors = [v for pairs in self._samples.values() for v, _ in pairs if isinstance(v, torch.Tensor)]
        # float64 holds every float32/bf16 value exactly, as float() does.
        host = iter(torch.stack([t.to(torch.float64) for t in tensors]).tolist() if tensors else [])
        return mean_across_ranks({key: [(next(host) if isinstance(v, torch.Tensor) else v) * scale
                                        for v, scale in pairs] for key, pairs in self._samples.items()})


def mean_across_ranks(values: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Local mean of each list, then the mean over ranks (one all-reduce; every rank has the same keys)."""
    keys = sorted(values)
    local = [sum(values[k]) / max(len(values[k]), 1) for k in keys]
    return dict(zip(keys, all_reduce_host(local, "mean")))


def batch_metrics(full: Mapping[str, torch.Tensor], *, kl_coef: float, max_response_length: int) -> dict[str, float]:
    """Batch-level metrics from the gathered batch (identical on every rank). Lengths count the whole continuation
    (``response_attention_mask``, as verl's ``response_length``); the rest reads the loss mask."""
    mask = full["response_mask"]
    score = full["token_level_scores"].sum(-1).float()
    reward = full["token_level_rewards"].sum(-1).float()
    lengths = full["response_attention_mask"].sum(-1).float()
    m: dict[str, float | torch.Tensor] = {
        "score/mean": score.mean(),
        "score/std": score.std(unbiased=False),
        "reward/mean": reward.mean(),
        "reward/std": reward.std(unbiased=False),
        "reward/max": reward.max(),
        "reward/min": reward.min(),
        "kl/coef": kl_coef,
        "advantages/mean": algos.masked_mean(full["advantages"], mask),
        "advantages/std": algos.masked_var(full["advantages"], mask).sqrt() if mask.sum() > 1 else torch.tensor(0.0),
        "returns/mean": algos.masked_mean(full["returns"], mask),
        "response/length_mean": lengths.mean(),
        "response/length_max": lengths.max(),
        "response/clip_ratio": (lengths >= max_response_length).float().mean(),
        "prompt/length_mean": full["prompt_len"].float().mean(),
    }
    if "ref_log_probs" in full:
        # KL(actor || reference) with the non-negative low-variance estimator (k3): the watchdog's signal.
        kl = algos.kl_penalty(full["old_log_probs"], full["ref_log_probs"], "low_var_kl")
        m["kl/actor_ref"] = algos.masked_mean(kl, mask, axis=-1).mean()
    if "values" in full:
        m["critic/values_mean"] = algos.masked_mean(full["values"], mask)
        m["critic/vf_explained_var"] = algos.explained_variance(full["values"], full["returns"], mask)
    if "rollout_log_probs" in full:
        m["rollout/logprob_gap"] = algos.masked_mean((full["rollout_log_probs"] - full["old_log_probs"]).abs(), mask)
    return {k: float(v) for k, v in m.items()}
