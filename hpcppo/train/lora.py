"""LoRA in the trainer: model builders that add the adapters (``[actor.lora]``, ``[critic.lora]``), and the merged
weights the rollout engine receives. The adapters themselves: :mod:`hpcppo.models.lora`.

Checkpoints hold the whole model (frozen base included) and the optimizer, which holds only the adapters' moments
(and the critic's value head): a checkpoint is then everything a resume, a rollback, a critic restart or
``hpcppo export`` needs, the same DCP path as a full fine-tune, exact by the same test; the base weights cost one
copy per checkpoint (a full fine-tune's checkpoint is three: weights and two AdamW moments).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from hpcppo.config.lora import LoraSection
from hpcppo.distributed.weights import clean_name, iter_full_params
from hpcppo.models.lora import LORA_INIT_SEED, apply_lora, has_lora, is_merged_part, merge_stream, scalings

__all__ = ["with_lora", "actor_weights", "adapter_seed"]


def adapter_seed(seed: int, role: str) -> int:
    """The adapters' init seed of ``role`` ("actor" or "critic") in a run seeded ``seed``: the run's seed decides
    them, as it decides the value head's, and the two models draw different streams."""
    return (seed * 1_000_003 + {"actor": 1, "critic": 2}[role] * LORA_INIT_SEED) % 2**63


def with_lora(build: Callable[..., nn.Module], lora: LoraSection, *,
              inside: Callable[[nn.Module], nn.Module] = lambda m: m,
              seed: int = LORA_INIT_SEED) -> Callable[..., nn.Module]:
    """``build`` (a ``models.build_*`` with its path) that also injects ``lora``'s adapters into ``inside(model)``
    (the critic's backbone), drawn from ``seed``; ``build`` itself when LoRA is off. Both ways of building a model
    for ``train.build.load_sharded`` (``empty=True`` on every rank, or whole on rank 0) get the same adapters."""
    if not lora.enabled:
        return build

    def build_with_adapters(**kwargs: Any) -> nn.Module:
        model = build(**kwargs)
        apply_lora(inside(model), rank=lora.rank, alpha=lora.alpha, target_modules=list(lora.target_modules),
                   exclude_modules=list(lora.exclude_modules), adapter=lora.adapter_path, seed=seed)
        return model

    return build_with_adapters


def actor_weights(actor: nn.Module, *, dtype: torch.dtype | None,
                  into: Mapping[str, torch.Tensor] | None) -> Iterator[tuple[str, torch.Tensor]]:
    """The actor's full weights under Hugging Face names for the rollout engine (COLLECTIVE, as
    ``iter_full_params``). With LoRA, merged (``models.lora.merge_stream``): an adapted layer's base weight and
    adapters are gathered in the master dtype so the merge is computed as peft's, then cast to ``dtype``; every
    other parameter (embeddings, norms, the head) is gathered in ``dtype`` as without LoRA, not at twice the bytes.
    The adapted layers' names (``.base_layer``) never match ``into``, so they are gathered into buffers and merged,
    the others straight into the engine as before."""
    if not has_lora(actor):
        return iter_full_params(actor, dtype=dtype, into=into)
    scaling = {clean_name(name): value for name, value in scalings(actor).items()}

    def gathered_as(name: str) -> torch.dtype | None:
        return None if is_merged_part(name) else dtype

    return merge_stream(iter_full_params(actor, dtype=gathered_as, into=into), scaling, dtype=dtype)
