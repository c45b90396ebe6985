"""The three networks of PPO, built from a Hugging Face directory: the actor (a causal LM, trained), the reference
(the same, frozen) and the critic (the backbone without its LM head plus a scalar value head), with the dtype map and
meta-device construction for sharded loading (:mod:`hpcppo.distributed.loading`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from hpcppo.errors import PathError


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``clamp(cumsum(mask) - 1, min=0)``: 0.. along the tokens of each row, 0 on left padding. ``[B, T]``."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


VALUE_HEAD_FILE = "value_head.safetensors"
VALUE_HEAD_SEED = 0x5EED


DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
"""The one map from dtype names (``hpcppo.config.experiment.DTYPE_NAMES``, what a spec may say) to torch dtypes."""
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}


def as_torch_dtype(dtype: torch.dtype | str) -> torch.dtype | str:
    """``torch.bfloat16`` or a name of :data:`DTYPES` (or an alias: ``"bf16"``, ``"fp32"``, ...); ``"auto"`` (as
    saved, for ``from_pretrained``) passes through."""
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    value = DTYPES.get(_DTYPE_ALIASES.get(str(dtype), str(dtype)))
    if value is None:
        raise ValueError(f"unknown dtype {dtype!r}; use {', '.join(DTYPES)} or auto")
    return value


def _load_kwargs(dtype: torch.dtype | str, trust_remote_code: bool, attn_implementation: str | None) -> dict:
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    # `dtype=` replaced `torch_dtype=` in transformers 4.56; vLLM environments may pin an older 4.x.
    dtype_kw = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    kwargs: dict = {dtype_kw: as_torch_dtype(dtype), "trust_remote_code": trust_remote_code}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    return kwargs


def _check_dir(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise PathError(f"model path {str(p)!r} is not a Hugging Face model directory (no config.json)")
    return p


def load_causal_lm(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype | str = "float32",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained`` on a local directory (no hub), on CPU."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(_check_dir(path)), **_load_kwargs(dtype, trust_remote_code, attn_implementation))


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every parameter registered inside is moved to the meta device as it is registered; buffers stay where the
    module's ``__init__`` makes them.

    A model built inside has its structure, dtypes and shapes, no parameter storage (an initialiser that runs after
    registration, like ``nn.Linear.reset_parameters``, acts on the meta tensor and costs nothing), and its buffers
    computed by its own code (rotary ``inv_freq``: loading never fills a non-persistent buffer, so building it on
    the meta device would leave it to be recomputed by hand for every model class).
    ``nn.Module.__setattr__`` registers a ``Parameter`` through ``register_parameter`` (torch/nn/modules/module.py),
    which is where the move happens.
    """
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def _from_config(auto_class: Any, path: Path, dtype: torch.dtype | str, trust_remote_code: bool,
                 attn_implementation: str | None) -> Any:
    """``auto_class.from_config`` on the directory's config with the parameters on the meta device (a Hugging Face
    model: ``Any``, as ``from_pretrained`` is to the type checker)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    kwargs = _load_kwargs(dtype, trust_remote_code, attn_implementation)
    with parameters_on_meta():
        return auto_class.from_config(config, **kwargs)


def build_actor(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype | str = "float32",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    empty: bool = False,
) -> nn.Module:
    """The trainable policy: an HF causal LM in train mode, KV cache off.

    ``dtype`` is the master-weight dtype (keep float32 and let FSDP's ``param_dtype`` cast for compute).
    Activation checkpointing: ``hpcppo.distributed.fsdp.apply_activation_checkpointing``. With ``empty`` the
    parameters are on the meta device (:func:`parameters_on_meta`), for ``hpcppo.distributed.loading`` to fill
    shard by shard; the weights are not read.
    """
    if empty:
        from transformers import AutoModelForCausalLM

        model = _from_config(AutoModelForCausalLM, _check_dir(path), dtype, trust_remote_code, attn_implementation)
    else:
        model = load_causal_lm(path, dtype=dtype, trust_remote_code=trust_remote_code,
                               attn_implementation=attn_implementation)
    cast(Any, model).config.use_cache = False  # a Hugging Face model's config: attributes nn.Module cannot type
    return model.train()


def build_reference(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype | str = "float32",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    empty: bool = False,
) -> nn.Module:
    """The frozen reference policy: the initial actor in eval mode, ``requires_grad=False``."""
    model = build_actor(path, dtype=dtype, trust_remote_code=trust_remote_code, attn_implementation=attn_implementation,
                        empty=empty)
    model.requires_grad_(False)
    return model.eval()


class Critic(nn.Module):
    """An HF backbone (the base model, no LM head) and a linear value head: ``[B, T]`` ids -> ``[B, T]`` values.

    The backbone's decoder layers are declared by its ``_no_split_modules``, which ``hpcppo.distributed.fsdp.find_layers``
    finds on any submodule, so ``apply_fsdp(critic, ...)`` shards layer by layer like the actor.

    The value head's weight is drawn from N(0, ``initializer_range``²) (verl's token-classification critic head
    is initialised the same way by HF) with a *fixed* generator, bias 0: every rank must build bit-identical
    weights before FSDP shards them, and a non-zero head lets gradients reach the backbone from the first step.
    """

    def __init__(self, backbone: nn.Module, *, value_head_seed: int = VALUE_HEAD_SEED):
        super().__init__()
        self.backbone = backbone
        config: Any = backbone.config  # a Hugging Face config
        self.config = config
        hidden = int(config.hidden_size)
        self.value_head = nn.Linear(hidden, 1, dtype=next(backbone.parameters()).dtype)
        std = float(getattr(config, "initializer_range", 0.02))
        generator = torch.Generator().manual_seed(value_head_seed)
        with torch.no_grad():
            weight = torch.randn(self.value_head.weight.shape, generator=generator) * std
            self.value_head.weight.copy_(weight)
            self.value_head.bias.zero_()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, T]`` long ids (+ mask, positions) -> ``[B, T]`` float32 values (one per position)."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False)
        # sum over the size-1 head dimension, not squeeze: FSDP2 warns about (and mishandles) a root returning a view
        return self.value_head(out.last_hidden_state).sum(-1).float()

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Save the backbone as an HF directory plus ``value_head.safetensors`` (``build_critic`` reloads both)."""
        from safetensors.torch import save_file

        cast(Any, self.backbone).save_pretrained(str(directory))
        head = {f"value_head.{k}": v.detach().cpu().contiguous() for k, v in self.value_head.state_dict().items()}
        tmp = Path(directory) / (VALUE_HEAD_FILE + ".tmp")
        save_file(head, str(tmp))
        os.replace(tmp, Path(directory) / VALUE_HEAD_FILE)


def build_critic(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype | str = "float32",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    empty: bool = False,
) -> Critic:
    """A critic initialised from a causal LM (or base model) directory, in train mode.

    ``AutoModel.from_pretrained`` keeps the backbone and drops the LM head. If the directory holds a
    ``value_head.safetensors`` (written by :meth:`Critic.save_pretrained`), the head is loaded from it. With
    ``empty`` the backbone's parameters are on the meta device (as :func:`build_actor`); the value head is real
    either way (its seeded initialisation, or the file's values: a few kilobytes).
    """
    from transformers import AutoModel

    directory = _check_dir(path)
    if empty:
        backbone = _from_config(AutoModel, directory, dtype, trust_remote_code, attn_implementation)
    else:
        backbone = AutoModel.from_pretrained(str(directory),
                                             **_load_kwargs(dtype, trust_remote_code, attn_implementation))
    backbone.config.use_cache = False
    critic = Critic(backbone)
    head_file = directory / VALUE_HEAD_FILE
    if head_file.is_file():
        from safetensors.torch import load_file

        state = {k.removeprefix("value_head."): v for k, v in load_file(str(head_file)).items()}
        critic.value_head.load_state_dict(state)
    return critic.train()


# -- batched forwards ----------------------------------------------------------------------------------------
