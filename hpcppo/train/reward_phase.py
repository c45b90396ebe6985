"""The reward phase's model-based and manager parts: the reward model's scores of a rollout batch (re-templated,
micro-batched, FSDP2-sharded like the reference) and the metrics of both it and DAPO's overlong penalty.

Where the score goes is verl's: ``RewardModelWorker._expand_to_token_level`` (verl/workers/fsdp_workers.py, b178a3c)
and ``RewardLoopManager.compute_rm_score`` (verl/experimental/reward_loop/reward_loop.py) put each sequence's score
on its last valid response token, as ``hpcppo.train.batching.place_scores`` does for rule-based scores; the trainer
then uses them as the token-level scores unchanged (hpcppo.config.reward explains why nothing is added).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hpcppo.data.rm_inputs import reward_model_ids
from hpcppo.distributed.env import all_reduce_host
from hpcppo.models.reward_model import compute_rm_scores
from hpcppo.train.batching import pack_rows

__all__ = ["RewardModelScorer", "overlong_metrics", "right_pad"]


def right_pad(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` ``[B, longest]``, right-padded (verl's ``left_pad=False`` for the reward model)."""
    width = max((len(r) for r in rows), default=1)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(list(row), dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids.to(device), mask.to(device)


def _agreed_groups(lengths: list[int], max_tokens: int) -> list[torch.Tensor]:
    """Row groups under ``max_tokens`` padded tokens, as many on every rank (collective: one host all-reduce)."""
    zeros = [0] * len(lengths)
    count = int(all_reduce_host([len(pack_rows(lengths, zeros, max_tokens))], "max")[0])
    return [torch.tensor(g, dtype=torch.long) for g in pack_rows(lengths, zeros, max_tokens, min(count, len(lengths)))]


@dataclass
class RewardModelScorer:
    """The reward model of a run and how it reads a batch (``[reward_model]``)."""

    model: nn.Module
    tokenizer: Any  # the reward model's tokenizer
    max_length: int
    micro_batch_size: int
    max_tokens: int = 0  # a token budget per forward instead of micro_batch_size rows

    def score(self, actor_tokenizer: Any, records: Sequence[Any], responses: torch.Tensor,
              attention: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """``[b]`` scores of this rank's samples and the batch's ``reward_model/*`` metrics (all ranks); the
        model reads each whole continuation (``attention``: the response attention mask, tool turns included).
        Collective: every rank calls it with as many rows as the others."""
        lengths = attention.sum(-1).tolist()
        valid = [row[: int(n)] for row, n in zip(responses.tolist(), lengths)]
        ids, cut = reward_model_ids(self.tokenizer, actor_tokenizer, [r.prompt for r in records], valid,
                                    self.max_length)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        input_ids, mask = right_pad(ids, int(pad or 0), responses.device)
        groups = _agreed_groups([len(r) for r in ids], self.max_tokens) if self.max_tokens else None
        scores = compute_rm_scores(self.model, input_ids, mask, groups, micro_batch_size=self.micro_batch_size)
        total, rows, truncated = all_reduce_host([float(scores.sum()), len(ids), cut], "sum")
        top = all_reduce_host([float(scores.max())] if len(ids) else [float("-inf")], "max")[0]
        bottom = all_reduce_host([float(scores.min())] if len(ids) else [float("inf")], "min")[0]
        metrics = {"reward_model/score_mean": total / max(rows, 1), "reward_model/score_max": top,
                   "reward_model/score_min": bottom, "reward_model/truncated_frac": truncated / max(rows, 1)}
        return scores, metrics


def overlong_metrics(penalties: Sequence[float]) -> dict[str, float]:
    """DAPO's logged overlong extra info over the batch (all ranks; collective): the mean ``overlong_reward`` and
    the fraction of responses with ``overlong`` (a penalty below 0)."""
    total, over, rows = all_reduce_host([sum(penalties), sum(p < 0 for p in penalties), len(penalties)], "sum")
    return {"reward_manager/overlong_reward_mean": total / max(rows, 1),
            "reward_manager/overlong_frac": over / max(rows, 1)}
