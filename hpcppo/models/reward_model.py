"""The reward model: a Hugging Face sequence-classification checkpoint read as one score per token, and the score
of each sequence's last valid token.

verl b178a3c, verl/workers/fsdp_workers.py, ``RewardModelWorker``: ``_build_model`` loads the checkpoint with
``AutoModelForTokenClassification`` and ``num_labels = 1`` (a sequence-classification checkpoint's ``score`` head
is the same linear map, applied at every position), ``_forward_micro_batch`` takes ``logits[:, :, 0]`` and keeps
the value at ``argmax(position_ids * attention_mask)``, the last valid token. The reward loop that is verl's
default at that commit asks vLLM's ``classify`` endpoint for the same model (``RewardLoopWorker.compute_score_disrm``
in verl/experimental/reward_loop/reward_loop.py, ``activation: False``: the raw logit), which pools the last token.
Both are the linear head on the last token's hidden state; transformers' own sequence-classification forward would
instead pool the last token that is not the pad id, which differs when the pad id is the EOS that ends a response.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from hpcppo.models.networks import _check_dir, _from_config, _load_kwargs

__all__ = ["RewardModel", "build_reward_model", "last_token_scores", "compute_rm_scores"]

#: The prefix of :class:`RewardModel`'s parameter names that the checkpoint does not have.
STRIP = "inner."


class RewardModel(nn.Module):
    """A sequence-classification model (``inner``) run as a token classifier: ``[B, T]`` ids -> ``[B, T]`` scores.

    The forward is the backbone and then the ``score`` head at every position (verl's token-classification read of
    the checkpoint); :func:`last_token_scores` picks the one verl uses. The wrapper is the FSDP root, so the
    backbone's and the head's root-level parameters are gathered by its forward.
    """

    def __init__(self, inner: nn.Module):
        super().__init__()
        head = getattr(inner, "score", None)
        if not isinstance(head, nn.Linear):
            raise ValueError(f"{type(inner).__name__} has no linear `score` head; hpcppo reads reward models whose "
                             f"classification head is `score` (Llama, Qwen2, Mistral, Gemma ... *ForSequenceClassification)")
        if head.out_features != 1:
            raise ValueError(f"the reward model's score head has {head.out_features} outputs; allowed: 1")
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor) -> torch.Tensor:
        inner: Any = self.inner  # a Hugging Face model: base_model and score are its attributes
        out = inner.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=False)
        # sum over the size-1 head dimension (not squeeze: FSDP2 mishandles a root returning a view)
        return inner.score(out.last_hidden_state).sum(-1).float()


def build_reward_model(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype | str = "float32",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    empty: bool = False,
) -> RewardModel:
    """The frozen reward model (eval mode, ``requires_grad=False``) from a sequence-classification directory, with
    ``num_labels = 1`` as verl sets it. ``empty``: parameters on the meta device, for
    ``hpcppo.distributed.loading`` to fill shard by shard (as ``build_actor``)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    directory = _check_dir(path)
    if empty:
        inner = _from_config(AutoModelForSequenceClassification, directory, dtype, trust_remote_code,
                             attn_implementation)
    else:
        config = AutoConfig.from_pretrained(str(directory), trust_remote_code=trust_remote_code, num_labels=1)
        inner = AutoModelForSequenceClassification.from_pretrained(
            str(directory), config=config, **_load_kwargs(dtype, trust_remote_code, attn_implementation))
    inner.config.use_cache = False
    model = RewardModel(inner)
    model.requires_grad_(False)
    return model.eval()


def last_token_scores(token_scores: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B]``: each row's score at its last valid token, ``argmax(position_ids * attention_mask)`` as verl's
    ``_forward_micro_batch`` (for right-padded rows, the last position whose mask is 1)."""
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0) * attention_mask.long()
    last = positions.argmax(-1)
    return token_scores[torch.arange(token_scores.shape[0], device=token_scores.device), last]


@torch.no_grad()
def compute_rm_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      micro_batches: Sequence[torch.Tensor] | None = None, *,
                      micro_batch_size: int = 1) -> torch.Tensor:
    """``[B]`` float32 scores of right-padded ``[B, T]`` rows, in micro-batches of ``micro_batch_size`` rows or of the
    given row groups (each row once), each trimmed to its longest row. Every rank must run as many forwards as the
    others (FSDP gathers per forward): equal row counts with a fixed size, or groups agreed across ranks."""
    rows_total = input_ids.shape[0]
    groups = list(micro_batches) if micro_batches is not None else [
        torch.arange(i, min(i + micro_batch_size, rows_total)) for i in range(0, rows_total, micro_batch_size)]
    scores = torch.zeros(rows_total, dtype=torch.float32, device=input_ids.device)
    for rows in groups:
        rows = rows.to(input_ids.device)
        mask = attention_mask[rows]
        width = max(int(mask.sum(-1).max()) if rows.numel() else 1, 1)
        mask = mask[:, :width]
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        token_scores = model(input_ids[rows][:, :width], mask, positions)
        scores[rows] = last_token_scores(token_scores, mask)
    return scores
