"""Mixture-of-experts weights in the layout of a checkpoint on disk, from the layout transformers holds in memory.

transformers 5 fuses a MoE's experts when it loads a checkpoint and splits them again when it saves one: the
per-model lists of ``WeightConverter``s in transformers/conversion_mapping.py (``get_checkpoint_conversion_mapping``;
Qwen3-MoE, DeepSeek-V2/V3, OLMoE and the other ``qwen2_moe`` aliases, Mixtral) say, for instance, that
``mlp.experts.*.gate_proj.weight`` and ``mlp.experts.*.up_proj.weight`` ([intermediate, hidden] each) become one
``mlp.experts.gate_up_proj`` [experts, 2 * intermediate, hidden] by ``MergeModulelist(dim=0)`` (stack the experts)
then ``Concatenate(dim=1)`` (gate first, then up), and ``mlp.experts.*.down_proj.weight`` becomes
``mlp.experts.down_proj`` [experts, hidden, intermediate] by ``MergeModulelist(dim=0)``; ``save_pretrained`` applies
the inverse (``revert_weight_conversion`` in transformers/core_model_loading.py), so the files carry the per-expert
names. Two users here. The meta-device loader (``hpcppo.distributed.loading``) fills a fused parameter's rows (its
experts) from the per-expert tensors of the files: :meth:`ExpertSplit.keys`. The trainer's actor streams the
in-memory names to the rollout engine (``hpcppo.distributed.weights.iter_full_params``); for vLLM,
:func:`checkpoint_layout` turns that stream into the names and shapes the files hold, which every vLLM MoE loader
takes: ``FusedMoE.make_expert_params_mapping`` / ``RoutedExperts.build_expert_params_mapping``
(vllm/model_executor/layers/fused_moe/routed_experts.py, vLLM 0.32.0) maps ``experts.{i}.gate_proj.`` to shard
``w1`` of expert i of ``w13_weight``, ``up_proj`` to ``w3``, ``down_proj`` to ``w2``. vLLM 0.32 also accepts the
fused names (its ``include_fused`` entries), but only in vLLM's own orientation (a model whose transformers class
holds them transposed needs ``is_fused_checkpoint_transposed``); the checkpoint's names are the one layout every
loader of the pinned range reads the way it reads the files.

A converter made of other operations (a ``Transpose``, a ``Chunk``...) is refused with the model type and the
pattern, never streamed in a layout nobody checked. Literal renamings in a list that fuses experts (Mixtral's
``.block_sparse_moe.`` -> ``.mlp.``) are inverted with it; lists without an expert converter (Gemma 3's multimodal
prefixes) are left alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch


class UnsupportedExpertLayout(ValueError):
    """transformers converts this model's weights in a way :func:`checkpoint_layout` cannot invert."""


@dataclass(frozen=True)
class ExpertSplit:
    """One fused in-memory expert tensor and the per-expert checkpoint names it came from.

    ``fused``: the in-memory name's ending (``mlp.experts.gate_up_proj``); ``parts``: the checkpoint patterns, ``*``
    standing for the expert index, concatenated along dimension 1 of each expert's slice in this order (one part:
    the slice itself).
    """

    fused: str
    parts: tuple[str, ...]

    def keys(self, prefix: str, expert: int) -> list[str]:
        """The checkpoint keys of ``expert``'s slice, in concatenation order (``prefix``: the name before
        ``fused``)."""
        return [prefix + pattern.replace("*", str(expert)) for pattern in self.parts]

    def split(self, prefix: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """The per-expert ``(name, tensor)`` pairs of ``tensor`` ([experts, len(parts) * rows, ...]), expert by
        expert, each a view of ``tensor``."""
        if tensor.dim() != 3 or tensor.shape[1] % len(self.parts):
            raise UnsupportedExpertLayout(f"{prefix}{self.fused}: expected [experts, {len(self.parts)} x rows, cols], "
                                          f"got {tuple(tensor.shape)}")
        for expert, block in enumerate(tensor.unbind(0)):
            yield from zip(self.keys(prefix, expert), block.chunk(len(self.parts), dim=0))


@dataclass(frozen=True)
class CheckpointLayout:
    """How a model type's in-memory names map back to its checkpoint's: expert splits and literal renamings
    (``(in_memory, on_disk)``)."""

    model_type: str
    splits: tuple[ExpertSplit, ...]
    renames: tuple[tuple[str, str], ...]

    def split_of(self, name: str) -> tuple[ExpertSplit, str] | None:
        """The split whose fused tensor ``name`` is (an in-memory name), and the name's prefix before it."""
        for split in self.splits:
            if name.endswith("." + split.fused):
                return split, name[: -len(split.fused)]
        return None


def _literal(pattern: str) -> str | None:
    """``pattern`` as plain text when it is one (dots allowed, no other regex syntax), else None."""
    return pattern if re.escape(pattern).replace("\\.", ".") == pattern else None


def layout_for(model_type: str) -> CheckpointLayout:
    """The inverse of transformers' load-time conversion for ``model_type`` (``get_checkpoint_conversion_mapping``);
    identity for a model type without expert converters. Raises :class:`UnsupportedExpertLayout` for a converter
    other than stacking experts (``MergeModulelist(dim=0)``), optionally followed by ``Concatenate(dim=1)``."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    transforms = get_checkpoint_conversion_mapping(model_type) or []
    converters = [t for t in transforms if hasattr(t, "operations")]
    if not converters:
        return CheckpointLayout(model_type, (), ())
    splits = []
    for conv in converters:
        ops = [(type(op).__name__, getattr(op, "dim", None)) for op in conv.operations]
        sources, targets = list(conv.source_patterns), list(conv.target_patterns)
        expected = [("MergeModulelist", 0)] + ([("Concatenate", 1)] if len(sources) > 1 else [])
        if ops != expected or len(targets) != 1 or not all(s.count("*") == 1 for s in sources):
            raise UnsupportedExpertLayout(
                f"{model_type}: transformers converts {sources} -> {targets} with {ops}; the vLLM sync splits only "
                f"stacked experts (MergeModulelist(dim=0), then Concatenate(dim=1) for several sources)")
        splits.append(ExpertSplit(targets[0].lstrip("."), tuple(s.lstrip(".") for s in sources)))
    renames = []
    for t in transforms:
        if hasattr(t, "operations"):
            continue
        pairs = list(zip(t.source_patterns, t.target_patterns))
        if len(pairs) != 1 or _literal(pairs[0][0]) is None or _literal(pairs[0][1]) is None:
            raise UnsupportedExpertLayout(f"{model_type}: transformers renames {t.source_patterns} -> "
                                          f"{t.target_patterns}, which the vLLM sync cannot invert")
        renames.append((pairs[0][1], pairs[0][0]))
    return CheckpointLayout(model_type, tuple(splits), tuple(renames))


def checkpoint_layout(named_tensors: Iterable[tuple[str, torch.Tensor]],
                      layout: CheckpointLayout) -> Iterator[tuple[str, torch.Tensor]]:
    """``named_tensors`` (in-memory names) with each fused expert tensor split into its per-expert checkpoint
    tensors (views, no copy) and the renamings inverted; other tensors pass unchanged. Lazy, one input at a time."""
    for name, tensor in named_tensors:
        for memory, disk in layout.renames:
            name = name.replace(memory, disk)
        found = layout.split_of(name)
        if found is None:
            yield name, tensor
        else:
            yield from found[0].split(found[1], tensor)
