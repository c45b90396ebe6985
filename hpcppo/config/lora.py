"""``[actor.lora]`` / ``[critic.lora]``: LoRA adapters instead of full fine-tuning, and compile's check of their
target modules against the model's ``config.json`` (no torch).

verl's keys (verl b178a3c, ``verl/workers/fsdp_workers.py``, ``ActorRolloutRefWorker._build_model_optimizer`` and
``CriticWorker._build_critic_model_optimizer``): LoRA is on when ``model.lora_rank > 0``; the adapter is peft's
``LoraConfig(r=lora_rank, lora_alpha=lora_alpha, target_modules=..., exclude_modules=..., bias="none")`` (no dropout:
peft's default 0), ``target_modules`` defaults to ``"all-linear"`` and ``lora_alpha`` to 16
(``verl/trainer/config/_generated_ppo_trainer.yaml``); the critic's LoRA takes no ``exclude_modules``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from hpcppo.config.fields import FieldValueError, opt
from hpcppo.errors import ConfigError, PathError

__all__ = ["LoraSection", "ALL_LINEAR", "linear_modules", "check_lora_targets", "check_adapter"]

ALL_LINEAR = "all-linear"
# A rank is at most the smaller dimension of an adapted layer (compile checks it against the model's config.json);
# without the model (--no-check-paths) this bound holds for every model: none has a layer 65,536 wide on both sides.
MAX_RANK = 65536

# The nn.Linear layers of a decoder layer, by config.json's model_type (transformers' modeling_<type>.py). The
# output layer (lm_head) is never a target: peft's "all-linear" leaves it out too, and with tied embeddings a merged
# lm_head would change the input embedding as well.
_LLAMA_LIKE = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_LINEAR_BY_TYPE: dict[str, tuple[str, ...]] = {
    **{t: _LLAMA_LIKE for t in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "olmo2",
                                "granite", "smollm3")},
    "phi3": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
}
# Mixture-of-experts types: transformers 5 holds the routed experts as fused 3-D parameters (``mlp.experts
# .gate_up_proj``), not nn.Linear layers, so hpcppo's adapters and their merge (W + scaling x B A per Linear) cannot
# cover them, and "all-linear" would reach them (models.lora refuses that when the job builds the model). The plain
# Linears are the attention projections, and Qwen2-MoE's shared expert.
_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_MOE_LINEAR: dict[str, tuple[str, ...]] = {"qwen3_moe": _ATTENTION, "mixtral": _ATTENTION,
                                           "qwen2_moe": _ATTENTION + ("gate_proj", "up_proj", "down_proj")}
_LINEAR_BY_TYPE.update(_MOE_LINEAR)


def _check_names(value: list[str]) -> str | None:
    if not value or any(not isinstance(v, str) or not v for v in value):
        return f"{value} must name at least one module (e.g. [\"all-linear\"] or [\"q_proj\", \"v_proj\"])"
    if ALL_LINEAR in value and len(value) > 1:
        return f"{value}: \"all-linear\" stands alone (it already names every linear layer but the output layer)"
    return None


def _check_excludes(value: list[str]) -> str | None:
    if ALL_LINEAR in value:
        return "\"all-linear\" cannot be excluded"
    return None


@attrs.frozen(kw_only=True)
class LoraSection:
    """``[actor.lora]`` / ``[critic.lora]``: train low-rank adapters (peft's LoRA) instead of every weight."""

    rank: int = opt(0, ge=0, le=MAX_RANK, help="LoRA rank r; 0 = full fine-tuning (verl's lora_rank). The base weights are frozen; "
                                  "the optimizer holds only the adapters (and the critic's value head); with the "
                                  "actor's LoRA the reference is the actor with its adapters disabled (no copy).")
    alpha: float = opt(16.0, gt=0.0, help="LoRA alpha: the update is (alpha / rank) x B A (verl's lora_alpha).")
    target_modules: list[str] = opt(factory=lambda: [ALL_LINEAR], check=_check_names,
                                    help="Linear layers given adapters, by name (q_proj, v_proj ...), or "
                                         "[\"all-linear\"]: every linear layer of the decoder, not the output layer "
                                         "(verl's target_modules); checked against the model's config.json.")
    exclude_modules: list[str] = opt(factory=list, check=_check_excludes,
                                     help="Linear layers left without an adapter (verl's exclude_modules); "
                                          "[] = none.")
    adapter_path: str = opt("", path=True, help="A trained adapter to start from (peft's format: adapter_config.json "
                                                "and adapter_model.safetensors, as hpcppo export writes in "
                                                "lora_adapter/; verl's lora_adapter_path), instead of lora_B = 0; "
                                                "its r, lora_alpha and target modules must be this section's. "
                                                "The reference stays the base model. Actor only.")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def __attrs_post_init__(self) -> None:
        # A setting of an adapter that does not exist would do nothing: refuse it rather than ignore it.
        if not self.enabled:
            for name, default in (("alpha", 16.0), ("target_modules", [ALL_LINEAR]), ("exclude_modules", []),
                                  ("adapter_path", "")):
                if getattr(self, name) != default:
                    raise FieldValueError(name, "sets up a LoRA adapter and does nothing with rank = 0 (full "
                                                "fine-tuning); set rank > 0")
        both = set(self.target_modules) & set(self.exclude_modules)
        if both:
            raise FieldValueError("exclude_modules", f"{sorted(both)} are also in target_modules")


def linear_modules(config: dict[str, Any]) -> tuple[str, ...] | None:
    """The names of the linear layers LoRA may target in a model with this ``config.json`` (a multimodal config's
    ``text_config`` counts), or None for a model type hpcppo does not know (checked when the job builds it)."""
    for source in (config, config.get("text_config")):
        if isinstance(source, dict) and source.get("model_type") in _LINEAR_BY_TYPE:
            return _LINEAR_BY_TYPE[source["model_type"]]
    return None


def check_lora_targets(key: str, lora: LoraSection, config: dict[str, Any], path: str) -> None:
    """``ConfigError`` naming ``key`` (``actor.lora`` / ``critic.lora``) when ``target_modules`` or
    ``exclude_modules`` name a layer the model at ``path`` does not have, or exclude every target."""
    if not lora.enabled:
        return
    known = linear_modules(config)
    if known is None:
        return
    model_type = config.get("model_type")
    if lora.target_modules == [ALL_LINEAR] and model_type in _MOE_LINEAR:
        raise ConfigError(f"\"all-linear\" would adapt the fused experts of {path} (model_type {model_type!r}), "
                          f"which LoRA here cannot merge; name the layers instead, e.g. target_modules = "
                          f"[{', '.join(repr(n) for n in known)}]".replace("'", '"'), key=f"{key}.target_modules")
    for field in ("target_modules", "exclude_modules"):
        for name in getattr(lora, field):
            if name != ALL_LINEAR and name not in known:
                raise ConfigError(f"{name!r} is not a linear layer of {path} (model_type "
                                  f"{config.get('model_type')!r}); allowed: \"all-linear\" or any of "
                                  f"{', '.join(known)}", key=f"{key}.{field}")
    targets = set(known) if lora.target_modules == [ALL_LINEAR] else set(lora.target_modules)
    if not targets - set(lora.exclude_modules):
        raise ConfigError(f"every target module is excluded ({', '.join(sorted(targets))}): nothing would train",
                          key=f"{key}.exclude_modules")
    _check_rank(key, lora.rank, targets - set(lora.exclude_modules), config, path)


def _layer_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear layer name of a decoder layer, from ``config.json`` (transformers'
    LlamaAttention/LlamaMLP and Phi3's fused projections); {} when the config lacks a size."""
    source = config if "hidden_size" in config else config.get("text_config") or {}
    try:
        hidden, inter = int(source["hidden_size"]), int(source["intermediate_size"])
        heads = int(source["num_attention_heads"])
        kv = int(source.get("num_key_value_heads") or heads)
        head_dim = int(source.get("head_dim") or hidden // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return {}
    return {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv * head_dim), "v_proj": (hidden, kv * head_dim),
            "o_proj": (heads * head_dim, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden), "qkv_proj": (hidden, (heads + 2 * kv) * head_dim),
            "gate_up_proj": (hidden, 2 * inter)}


def _check_rank(key: str, rank: int, targets: set[str], config: dict[str, Any], path: str) -> None:
    """A rank above a layer's smaller dimension adds parameters without adding rank (B A has rank min(in, out)):
    refused, naming the narrowest adapted layer."""
    shapes = _layer_shapes(config)
    sized = {name: min(shapes[name]) for name in targets if name in shapes}
    if not sized:
        return
    narrowest = min(sized, key=lambda n: sized[n])
    if rank > sized[narrowest]:
        raise ConfigError(f"{rank} is more than the narrowest adapted layer of {path} allows ({narrowest}: "
                          f"{shapes[narrowest][0]} x {shapes[narrowest][1]}); allowed: 1 to {sized[narrowest]}",
                          key=f"{key}.rank")


# adapter_config.json fields that must have peft's plain-LoRA value: hpcppo's adapters and their merge are those.
_PLAIN = {"peft_type": "LORA", "use_dora": False, "use_rslora": False, "bias": "none", "fan_in_fan_out": False,
          "lora_bias": False, "lora_dropout": 0.0}
_UNSET = ("rank_pattern", "alpha_pattern", "layers_to_transform", "modules_to_save", "layer_replication",
          "trainable_token_indices", "target_parameters")


def check_adapter(key: str, lora: LoraSection, config: dict[str, Any]) -> None:
    """``PathError``/``ConfigError`` naming ``key`` (``actor.lora.adapter_path``) when ``lora.adapter_path`` is not
    a peft LoRA adapter hpcppo can continue: its files, a plain LoRA (``_PLAIN``), and the section's rank, alpha and
    target modules (``"all-linear"`` expanded with the model's linear layers from its ``config``)."""
    if not lora.adapter_path:
        return
    directory = Path(lora.adapter_path)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        if not (directory / name).is_file():
            raise PathError(f"{key}: {directory} has no {name} (a peft LoRA adapter directory is expected, as "
                            f"hpcppo export writes in lora_adapter/)")
    try:
        saved = json.loads((directory / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise PathError(f"{key}: {directory}/adapter_config.json cannot be read: {exc}") from None
    if not isinstance(saved, dict):
        raise PathError(f"{key}: {directory}/adapter_config.json is not a JSON object")
    for field, plain in _PLAIN.items():
        if saved.get(field, plain) != plain:
            raise ConfigError(f"{directory}: the adapter's {field} is {saved.get(field)!r}; hpcppo continues plain "
                              f"LoRA adapters only ({field} = {plain!r})", key=key)
    for field in _UNSET:
        if saved.get(field):
            raise ConfigError(f"{directory}: the adapter sets {field} = {saved[field]!r}; hpcppo continues plain "
                              f"LoRA adapters only (no {field})", key=key)
    known = linear_modules(config)

    def names(value: Any, excluded: Any) -> set[str]:
        given = [value] if isinstance(value, str) else list(value or [])
        out = set(known) if given == [ALL_LINEAR] and known else _layer_names(given, key, directory, config)
        return out - set([excluded] if isinstance(excluded, str) else (excluded or []))

    theirs = (saved.get("r"), saved.get("lora_alpha"), names(saved.get("target_modules"), saved.get("exclude_modules")))
    ours = (lora.rank, lora.alpha, names(lora.target_modules, lora.exclude_modules))
    if theirs != ours:
        raise ConfigError(f"{directory}: the adapter has r = {theirs[0]}, lora_alpha = {theirs[1]}, target modules "
                          f"{sorted(theirs[2])}; this section has rank = {ours[0]}, alpha = {ours[1]}, "
                          f"{sorted(ours[2])}: set them to the adapter's", key=key)


def _layer_names(given: list[str], key: str, directory: Path, config: dict[str, Any]) -> set[str]:
    """Layer names from an adapter's target list: peft saves ``"all-linear"`` expanded to module paths
    (``model.layers.0.mlp.down_proj``); a name must then be adapted in every decoder layer, as hpcppo's targets are."""
    short = {name.rsplit(".", 1)[-1] for name in given}
    layers = next((s.get("num_hidden_layers") for s in (config, config.get("text_config")) if isinstance(s, dict)
                   and isinstance(s.get("num_hidden_layers"), int)), None)
    if layers is not None and any("." in name for name in given):
        for name in sorted(short):
            count = sum(1 for g in given if g.rsplit(".", 1)[-1] == name)
            if count != layers:
                raise ConfigError(f"{directory}: the adapter has {name} in {count} of the model's {layers} layers; "
                                  f"hpcppo adapts a layer name in every layer", key=key)
    return short
