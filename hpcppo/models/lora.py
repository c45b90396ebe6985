"""LoRA adapters (peft) on the actor and the critic's backbone, and their merge into plain weights.

Semantics are verl's (b178a3c, ``verl/workers/fsdp_workers.py``, ``ActorRolloutRefWorker._build_model_optimizer``):
peft's ``LoraConfig(r, lora_alpha, target_modules, exclude_modules, bias="none")``, no dropout, the base weights
frozen, the update ``W + (alpha / r) B A`` with ``B = 0`` at the start (so step 0 is the base model). Two choices
differ in form, not in math:

* The adapters are injected into the Hugging Face model itself (peft's ``inject_adapter_in_model``) instead of
  wrapping it in a ``PeftModel``: the actor keeps its class, its ``lm_head`` and its ``forward(logits_to_keep=...)``,
  which the chunked log-prob head relies on (``hpcppo.models.forward``), and the critic's value head stays outside
  the adapted backbone (trained whole, as verl's ``TOKEN_CLS`` task keeps its ``score`` head trainable).
* The adapters are initialised here, not by peft's ``reset_lora_parameters``: the model is built with its
  parameters on the meta device and every rank must hold the same values before FSDP2 shards them. ``lora_A`` is
  drawn as peft draws it (``kaiming_uniform_(a=sqrt(5))``, ``init_lora_weights=True``) from a generator seeded
  from the run's ``seed`` (one stream per model), walked in module order; ``lora_B`` is zero.

The reference policy with LoRA is the actor with its adapters disabled, as verl's ``ref_in_actor``
(``compute_ref_log_prob``: ``self.actor.actor_module.disable_adapter()``): :func:`adapters_disabled`.

The rollout engine gets merged weights (:func:`merge_stream`): ``W + (B @ A) * scaling`` under the base model's
names, computed in the master dtype as peft's ``Linear.merge`` / ``get_delta_weight`` computes it, then cast to the
engine's dtype. verl instead loads the base once and then sends only the adapters to vLLM's LoRA support
(``fsdp_workers.py``, ``rollout_mode``: ``collect_lora_params`` with ``base_sync_done``; vLLM's ``enable_lora``,
``max_loras=1`` in ``vllm_rollout/vllm_async_server.py``). Merged weights keep the engine on plain weights: the same
matmuls as the HF engine and as a full fine-tune, no punica LoRA kernels, no adapters cast to vLLM's LoRA dtype
separately from the base, no ``max_lora_rank`` limit, and the sync contract stays "full weights under HF names".
The price is that every sync sends the whole model, as a full fine-tune does.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Iterator
from typing import Any, cast

import torch
from torch import nn

__all__ = ["LORA_INIT_SEED", "ADAPTER", "apply_lora", "lora_layers", "has_lora", "adapters_disabled",
           "scalings", "merge_stream", "is_merged_part", "save_adapter"]

LORA_INIT_SEED = 1103
ADAPTER = "default"  # peft's adapter name
_BASE = ".base_layer."
_A = f".lora_A.{ADAPTER}.weight"
_B = f".lora_B.{ADAPTER}.weight"


def lora_layers(model: nn.Module) -> dict[str, Any]:
    """peft's LoRA layers of ``model`` by module name (activation-checkpoint wrappers left in the names)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return {name: module for name, module in model.named_modules() if isinstance(module, BaseTunerLayer)}


def has_lora(model: nn.Module) -> bool:
    return any(".lora_A." in name for name, _ in model.named_parameters())


def apply_lora(model: nn.Module, *, rank: int, alpha: float, target_modules: list[str],
               exclude_modules: list[str], adapter: str = "", seed: int = LORA_INIT_SEED) -> nn.Module:
    """Inject LoRA adapters into ``model`` in place (its parameters may be on the meta device) and return it: the
    base weights frozen, the adapters trainable and initialised identically on every rank (module docstring) from
    ``seed`` (the trainer passes one derived from the run's ``seed``), or, with ``adapter`` (a directory in peft's
    format), holding that adapter's weights."""
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.lora import Linear as LoraLinear

    targets: str | list[str] = target_modules[0] if target_modules == ["all-linear"] else list(target_modules)
    # peft annotates lora_alpha as int; its scaling is lora_alpha / r either way (verl passes its float through).
    settings: dict[str, Any] = dict(r=rank, lora_alpha=alpha, target_modules=targets,
                                    exclude_modules=exclude_modules or None, bias="none", lora_dropout=0.0)
    config = LoraConfig(**settings)
    try:
        inject_adapter_in_model(config, model)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model ..."
        raise ValueError(f"LoRA target_modules {target_modules}: {str(exc).splitlines()[0]}") from None
    layers = lora_layers(model)
    generator = torch.Generator().manual_seed(seed)
    for name, layer in layers.items():
        if not isinstance(layer, LoraLinear) or layer.fan_in_fan_out:
            raise ValueError(f"LoRA on {name} ({type(layer.get_base_layer()).__name__}): only nn.Linear layers are "
                             f"supported (their merge is W + scaling x B A)")
        a = cast(nn.Linear, layer.lora_A[ADAPTER])
        b = cast(nn.Linear, layer.lora_B[ADAPTER])
        dtype = cast(nn.Linear, layer.get_base_layer()).weight.dtype
        weight_a = torch.empty(a.weight.shape, dtype=dtype)
        nn.init.kaiming_uniform_(weight_a, a=math.sqrt(5), generator=generator)
        a.weight = nn.Parameter(weight_a)
        b.weight = nn.Parameter(torch.zeros(b.weight.shape, dtype=dtype))
    if adapter:
        _load_adapter(model, adapter)
    return model


def _load_adapter(model: nn.Module, directory: str) -> None:
    """Every adapter weight of ``model`` from ``directory/adapter_model.safetensors`` (peft's names:
    ``base_model.model.<module>.lora_A.weight``), cast to the parameter's dtype; ``ValueError`` naming the first
    weight the file lacks, has in another shape, or has beyond the model's adapters. Every rank reads the whole
    adapter (its size is ``r x (in + out)`` per layer) before the model is sharded."""
    from safetensors.torch import load_file

    file = os.path.join(directory, "adapter_model.safetensors")
    saved = {k.removeprefix("base_model.model."): v for k, v in load_file(file).items()}
    params = {name: p for name, p in model.named_parameters() if ".lora_" in name}
    with torch.no_grad():
        for name, param in params.items():
            key = name.replace(f".{ADAPTER}.weight", ".weight")
            tensor = saved.pop(key, None)
            if tensor is None or tensor.shape != param.shape:
                what = "has none" if tensor is None else f"has {tuple(tensor.shape)}"
                raise ValueError(f"{file}: {key} of shape {tuple(param.shape)} expected, the file {what}")
            param.copy_(tensor)
    if saved:
        raise ValueError(f"{file}: {len(saved)} tensors the model's adapters do not have: {sorted(saved)[:3]}")


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` computing with its base weights only (peft's ``enable_adapters(False)`` on every LoRA layer), for
    the reference log-probs; the adapters are back on afterwards, trainable as before."""
    layers = list(lora_layers(model).values())
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def scalings(model: nn.Module) -> dict[str, float]:
    """``alpha / r`` of every LoRA layer, by module name (wrappers' parts in it, as ``named_modules`` has them)."""
    return {name: float(layer.scaling[ADAPTER]) for name, layer in lora_layers(model).items()}


def merge_stream(named: Iterable[tuple[str, torch.Tensor]], scaling: dict[str, float], *,
                 dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Plain weights under the base model's names from a stream of a LoRA model's parameters (each name once, any
    order; e.g. ``iter_full_params`` of the sharded actor): ``<m>.base_layer.weight``, ``<m>.lora_A.default.weight``
    and ``<m>.lora_B.default.weight`` become ``<m>.weight = W + (B @ A) * scaling[m]`` once all three have come, in
    their dtype (the master dtype: peft's merge), then cast to ``dtype``; ``<m>.base_layer.bias`` becomes
    ``<m>.bias``; every other tensor passes (cast). Raises ``KeyError`` if a LoRA layer's tensors are incomplete."""
    pending: dict[str, dict[str, torch.Tensor]] = {}

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t if dtype is None else t.to(dtype)

    for name, tensor in named:
        module, part = _lora_part(name)
        if module is None:
            yield name.replace(_BASE, "."), cast(tensor)
            continue
        parts = pending.setdefault(module, {})
        parts[part] = tensor
        if len(parts) == 3:
            del pending[module]
            w, a, b = parts["w"], parts["a"], parts["b"]
            merged = w + (b.to(w.dtype) @ a.to(w.dtype)) * scaling[module]
            yield f"{module}.weight", cast(merged)
    if pending:
        raise KeyError(f"LoRA layers without all of base weight, lora_A and lora_B: {sorted(pending)[:3]}")


def is_merged_part(name: str) -> bool:
    """Whether ``name`` is one of the three tensors :func:`merge_stream` merges (an adapted layer's base weight,
    ``lora_A`` or ``lora_B``)."""
    return _lora_part(name)[0] is not None


def _lora_part(name: str) -> tuple[str | None, str]:
    for suffix, part in ((_BASE + "weight", "w"), (_A, "a"), (_B, "b")):
        if name.endswith(suffix):
            return name[: -len(suffix)], part
    return None, ""


def save_adapter(model: nn.Module, directory: str | os.PathLike[str], base_model: str) -> None:
    """Write ``model``'s adapters (unsharded) in peft's format, as ``PeftModel.save_pretrained`` writes them:
    ``adapter_config.json`` and ``adapter_model.safetensors`` under ``base_model.model.<module>.lora_A.weight``
    names, so ``PeftModel.from_pretrained(base, directory)`` (or vLLM's LoRA support) loads them onto ``base_model``.
    verl saves its adapter the same way (``fsdp_workers.py``, ``save_checkpoint``: ``lora_adapter/``)."""
    from peft.utils.save_and_load import get_peft_model_state_dict
    from safetensors.torch import save_file

    config = cast(Any, model).peft_config[ADAPTER]
    config.base_model_name_or_path = str(base_model)
    os.makedirs(directory, exist_ok=True)
    config.save_pretrained(str(directory))
    state = get_peft_model_state_dict(model, adapter_name=ADAPTER)
    save_file({f"base_model.model.{k}": v.detach().contiguous() for k, v in state.items()},
              os.path.join(directory, "adapter_model.safetensors"))
