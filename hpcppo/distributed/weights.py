"""Stream full weights out of an FSDP2 model, one parameter at a time, under Hugging Face names.

This is how a rollout engine (a plain, unsharded copy of the actor; or vLLM's ``load_weights``) gets fresh
weights after every update without ever holding two full state dicts: each sharded parameter is all-gathered
(``DTensor.full_tensor()``), handed to the consumer, and dropped before the next one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

# Wrapper prefixes that are not part of the Hugging Face name: activation-checkpoint wrappers, FSDP1 wrappers,
# torch.compile's OptimizedModule.
_WRAPPER_PARTS = ("_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_orig_mod")


def clean_name(name: str) -> str:
    """Drop wrapper components from a dotted parameter name.

    >>> clean_name("model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight")
    'model.layers.0.mlp.up_proj.weight'
    """
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_PARTS)


def iter_full_params(
    model: nn.Module,
    *,
    dtype: torch.dtype | None = None,
    include_buffers: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full_tensor)`` for every parameter of ``model`` (sharded or not), in a fixed order.

    COLLECTIVE: for an FSDP model every rank must create this iterator and consume it to the end, in step with
    the others — each ``next()`` runs one all-gather, so a rank that stops early (or iterates alone) deadlocks the
    rest until the process-group timeout. Each yielded tensor has the parameter's full shape (e.g.
    ``[vocab, hidden]``), on the device the gather ran on. It may share memory with the training weights (an
    unsharded model, or a 1-rank mesh where the gather is a no-op): treat it as read-only, copy it, let it go.
    ``dtype`` (e.g. ``torch.bfloat16``) casts the local shard *before* the gather, halving traffic for a bf16 engine.
    Tied parameters are yielded once (as ``named_parameters`` does).
    ``include_buffers`` also yields persistent buffers (replicated in FSDP2, so no collective).
    """
    # A module left unsharded (reshard_after_forward=False after a no-grad forward) registers plain unsharded
    # tensors; resharding (local, no collective) puts the DTensors back so every rank sees the same names/order.
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    with torch.no_grad():
        for name, param in model.named_parameters():
            tensor = param.detach()
            if dtype is not None:
                tensor = tensor.to(dtype)
            if isinstance(tensor, DTensor):
                mesh_device = tensor.device_mesh.device_type
                if tensor.device.type != mesh_device:
                    # CPU-offloaded shards must visit the communication device (NCCL cannot gather host memory).
                    tensor = tensor.to(mesh_device)
                tensor = tensor.full_tensor()
            yield clean_name(name), tensor
            del tensor
        if include_buffers:
            non_persistent = {
                f"{mod_name}.{b}" if mod_name else b
                for mod_name, mod in model.named_modules()
                for b in getattr(mod, "_non_persistent_buffers_set", ())
            }
            for name, buf in model.named_buffers():
                if name not in non_persistent:
                    yield clean_name(name), buf.detach()


def load_into(
    module: nn.Module,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    strict: bool = True,
) -> list[str]:
    """Copy ``named_tensors`` into the plain (unsharded) ``module``'s parameters and buffers, by cleaned name.

    Each tensor is consumed as it arrives (pass ``iter_full_params(...)`` directly to stream). Dtype and device are
    converted by ``copy_`` (an fp32 actor into a bf16 engine is fine); shapes must match exactly. Raises
    ``KeyError`` for a name the module lacks, ``ValueError`` for a shape mismatch, and with ``strict`` a
    ``KeyError`` listing parameters that received nothing. Returns the names loaded, in order.
    """
    targets: dict[str, torch.Tensor] = {clean_name(n): p for n, p in module.named_parameters()}
    params = set(targets)
    for n, b in module.named_buffers():
        targets.setdefault(clean_name(n), b)
    loaded: list[str] = []
    with torch.no_grad():
        for name, tensor in named_tensors:
            target = targets.get(name)
            if target is None:
                raise KeyError(f"{type(module).__name__} has no parameter or buffer named {name!r}")
            if isinstance(target, DTensor):
                raise TypeError(f"load_into expects an unsharded module; {name!r} is a DTensor")
            if target.shape != tensor.shape:
                raise ValueError(f"shape mismatch for {name!r}: module has {tuple(target.shape)}, "
                                 f"source has {tuple(tensor.shape)}")
            target.copy_(tensor)
            loaded.append(name)
    if strict:
        missing = sorted(params - set(loaded))
        if missing:
            raise KeyError(f"{len(missing)} parameters were not in the source: {missing[:5]}"
                           + (" ..." if len(missing) > 5 else ""))
    return loaded
