"""FSDP2 (``fully_shard``) and activation checkpointing for Hugging Face causal LMs and critics built on them.

A decoder layer is the unit of sharding: its parameters are gathered just before it runs and freed after, so peak
memory holds one layer in full plus the shards of the rest. The root module is sharded last and owns whatever is
left (embeddings, final norm, LM head or value head).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

# Prefixes that wrappers insert into parameter names; weights.py strips them to get Hugging Face names back.
CHECKPOINT_WRAPPER_ATTR = "_checkpoint_wrapped_module"


def _no_split_class_names(model: nn.Module) -> set[str]:
    """Class names that Hugging Face models declare as atomic blocks (``_no_split_modules``), on any submodule.

    A critic is a plain ``nn.Module`` holding an HF backbone, so the declaration is searched for on every submodule.
    """
    names: set[str] = set()
    for module in model.modules():
        declared = getattr(module, "_no_split_modules", None)
        if isinstance(declared, (list, tuple, set)):
            names.update(str(n) for n in declared)
    return names


def _largest_uniform_module_list(model: nn.Module) -> list[nn.Module]:
    """The children of the biggest ``nn.ModuleList`` whose entries all share one class (the usual layer stack)."""
    best: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > len(best):
            children = list(module)
            inner = [getattr(c, CHECKPOINT_WRAPPER_ATTR, c) for c in children]
            if len({type(c) for c in inner}) == 1:
                best = children
    return best


def find_layers(model: nn.Module, layer_classes: tuple[type, ...] | None = None) -> list[nn.Module]:
    """The modules to shard one by one, in forward order.

    Discovery, first match wins: instances of ``layer_classes``; classes named in ``_no_split_modules`` (on any
    submodule, so a critic wrapping an HF backbone works); the largest uniform ``nn.ModuleList``. A layer wrapped
    by an activation-checkpoint wrapper is returned as the wrapper, so the wrapper's forward sees gathered weights.
    Raises ``ValueError`` when nothing matches.
    """
    parent_of: dict[int, nn.Module] = {}
    for module in model.modules():
        inner = getattr(module, CHECKPOINT_WRAPPER_ATTR, None)
        if isinstance(inner, nn.Module):
            parent_of[id(inner)] = module

    if layer_classes:
        found = [m for m in model.modules() if isinstance(m, layer_classes)]
    else:
        names = _no_split_class_names(model)
        found = [m for m in model.modules() if type(m).__name__ in names] if names else []
        if not found:
            found = _largest_uniform_module_list(model)
    layers = [parent_of.get(id(m), m) for m in found]
    if not layers:
        raise ValueError(f"no decoder layers found in {type(model).__name__}: pass layer_classes=(...) naming the "
                         "block class to shard")
    return layers


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    param_dtype: torch.dtype | None,
    reduce_dtype: torch.dtype | None,
    cpu_offload: bool,
    reshard_after_forward: bool,
    layer_classes: tuple[type, ...] | None = None,
) -> nn.Module:
    """Shard ``model`` in place over ``mesh`` (1-D ``shard`` = FSDP, 2-D ``replicate × shard`` = HSDP).

    Each layer found by ``find_layers`` becomes its own FSDP unit, then the root. ``param_dtype`` is the compute
    dtype of gathered parameters (e.g. ``torch.bfloat16``; the sharded master copy stays in its original dtype),
    ``reduce_dtype`` the gradient reduce-scatter dtype (``torch.float32`` keeps reductions exact). ``cpu_offload``
    keeps shards, gradients and optimizer state in host memory (pinned only on CUDA).
    ``reshard_after_forward=False`` trades memory for not re-gathering the layer in backward.
    Apply activation checkpointing before this, and build the optimizer after it. Returns ``model``.
    """
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    offload: OffloadPolicy = CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda") if cpu_offload else OffloadPolicy()
    kwargs: dict[str, Any] = {"mesh": mesh, "mp_policy": mp_policy, "offload_policy": offload}
    layers = find_layers(model, layer_classes)
    for layer in layers:
        if not isinstance(layer, FSDPModule):
            fully_shard(layer, reshard_after_forward=reshard_after_forward, **kwargs)
    fully_shard(model, reshard_after_forward=reshard_after_forward, **kwargs)
    return model


def _outermost(modules: Iterable[nn.Module]) -> list[nn.Module]:
    chosen: list[nn.Module] = []
    for m in modules:
        if not any(any(c is m for c in outer.modules()) for outer in chosen):
            chosen.append(m)
    return chosen


def apply_activation_checkpointing(model: nn.Module, layer_classes: tuple[type, ...] | None = None) -> nn.Module:
    """Recompute each layer's activations in backward instead of storing them (call before ``apply_fsdp``).

    Hugging Face models (the model itself or the backbone inside a critic) use their own non-reentrant gradient
    checkpointing, which keeps parameter names unchanged. Other models get torch's non-reentrant
    ``checkpoint_wrapper`` around each layer (names gain ``_checkpoint_wrapped_module.``, which
    ``weights.iter_full_params`` strips). Only active in ``train()`` mode. Returns ``model``.
    """
    hf = _outermost(m for m in model.modules() if getattr(m, "supports_gradient_checkpointing", False)
                    and hasattr(m, "gradient_checkpointing_enable"))
    if hf and layer_classes is None:
        for m in hf:
            # transformers 5.x renamed the method; the old name warns (and goes away in v6).
            if hasattr(m, "activation_checkpointing_enable"):
                getattr(m, "activation_checkpointing_enable")(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                getattr(m, "gradient_checkpointing_enable")(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    targets = {id(m) for m in find_layers(model, layer_classes)}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in targets:
                parent.register_module(name, checkpoint_wrapper(child, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
    return model


def _param_groups(model: nn.Module) -> Iterable[Any]:
    for module in model.modules():
        if isinstance(module, FSDPModule):
            yield from module._get_fsdp_state()._fsdp_param_groups


def held_gradient_bytes(model: nn.Module) -> int:
    """Bytes of every distinct storage that holds a gradient of ``model``'s parameters right now, FSDP2's internal
    ones included: the sharded ``.grad``, an unsharded parameter's ``.grad``, the unsharded accumulated gradient of
    a backward that did not reduce, HSDP's partial reduce output (torch 2.13 ``FSDPParam`` / ``FSDPParamGroup``
    attributes). A diagnostic for tests and benchmarks (``tools/bench_grad_accum.py``), never on the training path.
    """
    seen: set[int] = set()
    total = 0

    def add(t: torch.Tensor | None) -> None:
        nonlocal total
        if t is None:
            return
        storage = getattr(t, "_local_tensor", t).untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()

    for group in _param_groups(model):
        for fp in group.fsdp_params:
            add(fp.sharded_param.grad)
            unsharded = getattr(fp, "_unsharded_param", None)
            add(None if unsharded is None else unsharded.grad)
            add(fp.unsharded_accumulated_grad)
        add(group._partial_reduce_output)
    return total


def largest_unit_bytes(model: nn.Module) -> int:
    """The unsharded size in bytes of the largest FSDP unit (a layer, or the root's leftovers): what one unit's
    gathered parameters, or its gradient before the reduce-scatter, take at most."""
    return max((sum(fp._orig_size.numel() * fp.sharded_param.element_size() for fp in g.fsdp_params)
                for g in _param_groups(model)), default=0)
