"""Hugging Face safetensors weights straight into FSDP2 shards: each rank reads only its own rows.

The trainer builds actor, reference and critic with their parameters on the meta device
(``hpcppo.models.build_actor(..., empty=True)``), shards them (``apply_fsdp``), gives every parameter storage for its
shard (:func:`materialize`), and fills each shard with ``safe_open(file).get_slice(key)[rows]`` (:func:`load_shards`):
no rank holds, or reads, more than its shards of the model plus one slice in the file's dtype. Which rows a rank owns
is DTensor's answer for the parameter's placements (``compute_local_shape_and_global_offset``): FSDP2 shards dim 0
with ``torch.chunk`` and pads the last shards (``_chunk_with_empty`` in torch 2.13's
``torch/distributed/fsdp/_fully_shard/_fsdp_common.py``, used by ``FSDPParam._init_sharded_param``), the same rows as
a ``Shard(0)`` DTensor's; HSDP's ``(Replicate, Shard(0))`` gives every replica the same rows.

Buffers (rotary ``inv_freq``) are built on CPU by the model's own ``__init__`` (``models.parameters_on_meta``) and
kept across :func:`materialize`; so are parameters that were real before it (the critic's value head).

:func:`match_checkpoint` decides whether a directory can be loaded this way: every meta parameter must find a tensor
of its shape under its own name (or with the base model's prefix added or removed, as ``from_pretrained`` does for a
critic's backbone read from a causal LM), or, for the fused experts of a mixture-of-experts model (transformers 5
holds Qwen3-MoE's ``mlp.experts.gate_up_proj`` as one [experts, 2 x intermediate, hidden] tensor, the files keep
``mlp.experts.{i}.gate_proj.weight`` ...), the per-expert tensors it is stacked from, in the order transformers'
conversion mapping concatenates them (``hpcppo.distributed.expert_layout``): a rank's rows of such a parameter are
its experts, each read whole and concatenated. When a parameter finds neither (``.bin`` weights, other key
conversions transformers applies for some architectures, missing weights that ``from_pretrained`` would
initialise), rank 0 alone builds the whole
model with ``from_pretrained`` and :func:`broadcast_shards` sends it tensor by tensor, each rank keeping its rows
(verl's ``fsdp2_load_full_state_dict`` does the same with a full state dict): one whole copy on the node of rank 0,
one tensor in flight elsewhere.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from hpcppo.distributed.env import collective_device, get_rank
from hpcppo.distributed.expert_layout import CheckpointLayout, UnsupportedExpertLayout, layout_for
from hpcppo.distributed.fsdp import CHECKPOINT_WRAPPER_ATTR

__all__ = ["checkpoint_tensors", "match_checkpoint", "materialize", "load_shards", "broadcast_shards"]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

ExpertKeys = tuple[tuple[str, ...], ...]
"""The checkpoint keys of a fused expert parameter: per expert (its dim-0 row), the keys concatenated along dim 0."""


def checkpoint_tensors(directory: str | Path) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """Every tensor of a Hugging Face directory's safetensors weights: key -> (file, shape), from the files'
    headers only. Empty when the directory has no safetensors weights."""
    directory = Path(directory)
    index = directory / INDEX_FILE
    if index.is_file():
        files = sorted({directory / name for name in json.loads(index.read_text())["weight_map"].values()})
    elif (directory / SINGLE_FILE).is_file():
        files = [directory / SINGLE_FILE]
    else:
        return {}
    out: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                out[key] = (file, tuple(f.get_slice(key).get_shape()))
    return out


def _candidates(name: str, prefixes: Iterable[str]) -> list[str]:
    """Checkpoint keys a parameter may be stored under: its name without wrapper parts (activation checkpointing's,
    peft's ``base_layer``), and with each of the HF base-model ``prefixes`` added or removed."""
    # peft's LoRA layer holds the checkpoint's Linear as its base_layer (hpcppo.models.lora).
    name = name.replace(CHECKPOINT_WRAPPER_ATTR + ".", "").replace(".base_layer.", ".")
    out = [name]
    for prefix in prefixes:
        out.append(name.removeprefix(prefix + ".") if name.startswith(prefix + ".") else f"{prefix}.{name}")
    return out


def _base_prefixes(model: nn.Module) -> list[str]:
    return sorted({p for m in model.modules() if isinstance(p := getattr(m, "base_model_prefix", None), str) and p})


def _layout(model: nn.Module) -> CheckpointLayout | None:
    """The checkpoint layout of the model type of ``model``'s (first) config; None without one, or for a conversion
    that cannot be inverted (then a fused parameter finds no key and the caller's fallback loads it)."""
    model_type = next((t for m in model.modules()
                       if isinstance(t := getattr(getattr(m, "config", None), "model_type", None), str)), None)
    if model_type is None:
        return None
    try:
        return layout_for(model_type)
    except UnsupportedExpertLayout:
        return None


def _expert_keys(name: str, shape: tuple[int, ...], layout: CheckpointLayout | None,
                 tensors: dict[str, tuple[Path, tuple[int, ...]]]) -> ExpertKeys | None:
    """The per-expert keys of the fused parameter ``name`` when the checkpoint has every one, each expert's parts
    adding up to ``shape[1:]``; else None."""
    found = layout.split_of(name) if layout is not None and len(shape) == 3 else None
    if found is None:
        return None
    split, prefix = found
    out = []
    for expert in range(shape[0]):
        keys = split.keys(prefix, expert)
        shapes = [tensors[k][1] if k in tensors else None for k in keys]
        if any(s is None or len(s) != 2 or s[1] != shape[2] for s in shapes) or sum(
                s[0] for s in shapes if s is not None) != shape[1]:
            return None
        out.append(tuple(keys))
    return tuple(out)


def match_checkpoint(model: nn.Module, directory: str | Path, *,
                     strip: str = "") -> tuple[dict[str, str | ExpertKeys], list[str]]:
    """Which checkpoint key fills each meta parameter of ``model``.

    Args:
        model: built with its parameters on the meta device (those already real are not looked up).
        directory: a Hugging Face model directory.
        strip: a prefix of ``model``'s parameter names that the checkpoint does not have (``"backbone."`` for the
            critic).

    Returns:
        ``({parameter name: key, or a fused expert parameter's ExpertKeys}, [parameters without a tensor of their
        shape])``; a parameter shared by several names (tied embeddings) appears once, under the first of its names
        that the checkpoint has.
    """
    tensors = checkpoint_tensors(directory)
    prefixes = _base_prefixes(model)
    layout = _layout(model)
    names: dict[int, list[str]] = defaultdict(list)
    params: dict[int, nn.Parameter] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if param.is_meta or (isinstance(param, DTensor) and param.to_local().is_meta):
            names[id(param)].append(name)
            params[id(param)] = param
    found: dict[str, str | ExpertKeys] = {}
    missing: list[str] = []
    for pid, aliases in names.items():
        shape = tuple(params[pid].shape)
        key: str | ExpertKeys | None = next((k for a in aliases for k in _candidates(a.removeprefix(strip), prefixes)
                                             if k in tensors and tensors[k][1] == shape), None)
        if key is None:
            key = next((e for a in aliases for k in _candidates(a.removeprefix(strip), prefixes)
                        if (e := _expert_keys(k, shape, layout, tensors)) is not None), None)
        if key is None:
            missing.append(aliases[0])
        else:
            found[aliases[0]] = key
    return found, missing


def materialize(model: nn.Module, device: torch.device) -> list[str]:
    """Storage on ``device`` for every meta parameter (its shard, for an FSDP2 parameter), uninitialised; every
    parameter that was real keeps its values, every buffer stays the tensor it was (values and device: with FSDP2's
    CPU offload the shards live on the host, ``device``, while buffers stay on the GPU where ``fully_shard`` put them).
    ``nn.Module.to_empty`` as torchtitan uses it after ``fully_shard``; FSDP2 re-pads uneven shards at its lazy init
    (``FSDPParam.reset_sharded_param``, torch/distributed/fsdp/_fully_shard/_fsdp_param.py). Returns the names of
    the parameters that were on the meta device (each shared parameter once), in ``named_parameters`` order."""
    kept, fresh = {}, []
    for name, param in model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        if local.is_meta:
            fresh.append(name)
        else:
            kept[name] = local.detach().clone()
    buffers = list(model.named_buffers(remove_duplicate=False))
    shared: dict[int, list[str]] = defaultdict(list)
    for name, param in model.named_parameters(remove_duplicate=False):
        shared[id(param)].append(name)
    model.to_empty(device=device)
    # A meta tensor's storage cannot be swapped in place, so to_empty gives each module a new Parameter
    # (nn.Module._apply): tied weights would come out as two; every name of a shared parameter gets the first's.
    for names in shared.values():
        first = model.get_parameter(names[0])
        for name in names[1:]:
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, first)
    for name, buffer in buffers:
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner)._buffers[leaf] = buffer
    with torch.no_grad():
        for name, value in kept.items():
            param = model.get_parameter(name)
            (param.to_local() if isinstance(param, DTensor) else param).copy_(value)
    return fresh


def _rows(param: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """The tensor to fill (the local shard) and the range of dim-0 rows of the full parameter it holds."""
    if not isinstance(param, DTensor):
        return param, 0, param.shape[0] if param.dim() else 0
    if any(not isinstance(p, (Shard, Replicate)) or (isinstance(p, Shard) and p.dim != 0) for p in param.placements):
        raise ValueError(f"cannot load a parameter placed as {param.placements}: only Shard(0) and Replicate")
    local = param.to_local()
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    if tuple(shape) != tuple(local.shape):
        raise AssertionError(f"local shard {tuple(local.shape)} != DTensor's {tuple(shape)}")
    start = offset[0] if param.dim() else 0
    return local, start, start + (shape[0] if param.dim() else 0)


def _load_experts(local: torch.Tensor, start: int, stop: int, keys: ExpertKeys,
                  tensors: dict[str, tuple[Path, tuple[int, ...]]]) -> int:
    """Fill ``local`` (rows ``start:stop`` of a fused expert parameter: those experts) from each expert's tensors,
    concatenated along their dim 0 (transformers' ``Concatenate(dim=1)`` of the stacked experts); the bytes read."""
    read = 0
    for row, expert in enumerate(range(start, stop)):
        parts = []
        for key in keys[expert]:
            with safe_open(str(tensors[key][0]), framework="pt", device="cpu") as f:
                parts.append(f.get_tensor(key))
        read += sum(p.numel() * p.element_size() for p in parts)
        local[row].copy_(torch.cat(parts, dim=0))
    return read


def load_shards(model: nn.Module, directory: str | Path, keys: dict[str, str | ExpertKeys]) -> int:
    """Fill each parameter named in ``keys`` (from :func:`match_checkpoint`) with its rows of the checkpoint's
    tensor, read with ``get_slice`` (only those rows are read) and cast to the parameter's dtype as
    ``from_pretrained(dtype=...)`` does; a fused expert parameter's rows (experts) from their per-expert tensors.
    Returns the bytes read."""
    tensors = checkpoint_tensors(directory)
    params = dict(model.named_parameters(remove_duplicate=False))
    by_file: dict[Path, list[tuple[str, str]]] = defaultdict(list)
    read = 0
    with torch.no_grad():
        for name, key in keys.items():
            if isinstance(key, str):
                by_file[tensors[key][0]].append((name, key))
                continue
            local, start, stop = _rows(params[name])
            read += _load_experts(local, start, stop, key, tensors)
    with torch.no_grad():
        for file, items in by_file.items():
            for name, key in items:
                local, start, stop = _rows(params[name])
                if local.numel() == 0:
                    continue
                # One open per tensor: safetensors maps the file, and the pages a read touches count in the
                # process's resident set until the map is closed; closed after each tensor, a rank's peak is its
                # shards plus one slice, not plus its share of every file.
                with safe_open(str(file), framework="pt", device="cpu") as f:
                    data = f.get_slice(key)[start:stop] if local.dim() else f.get_tensor(key)
                    read += data.numel() * data.element_size()
                    local.copy_(data.reshape(local.shape))
                    del data
    return read


def broadcast_shards(model: nn.Module, full: nn.Module | None, names: list[str], *, src: int = 0) -> int:
    """Fill the parameters ``names`` of ``model`` (sharded; what :func:`materialize` returned) from ``full``, the whole
    model that only rank ``src`` built (``None`` on the others): one broadcast per parameter, in the same order on
    every rank, on the collective device (the GPU under NCCL), each rank keeping its rows. Returns the bytes moved.

    ``full`` has ``model``'s parameter names (the same builder), less activation-checkpoint wrapper prefixes.
    """
    if (full is None) != (get_rank() != src):
        raise ValueError(f"the whole model is given on rank {src} only")
    device = collective_device()
    moved = 0
    with torch.no_grad():
        for name in names:
            param = model.get_parameter(name)
            if full is not None:
                tensor = full.get_parameter(name.replace(CHECKPOINT_WRAPPER_ATTR + ".", "")).detach()
                tensor = tensor.to(device=device, dtype=param.dtype).contiguous()
            else:
                tensor = torch.empty(param.shape, dtype=param.dtype, device=device)
            torch.distributed.broadcast(tensor, src=src)
            moved += tensor.numel() * tensor.element_size()
            local, start, stop = _rows(param)
            if local.numel():
                local.copy_(tensor[start:stop] if local.dim() else tensor)
            del tensor
    return moved
