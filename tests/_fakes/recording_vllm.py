"""A RECORDING STAND-IN for the ``vllm`` package: not vLLM, and never proof that vLLM works.

It has the few names ``hpcppo.rollout.vllm_engine`` touches (``LLM``, ``SamplingParams``; on ``LLM``: ``generate``,
``sleep``, ``wake_up``, ``reset_prefix_cache`` and the in-process model path with ``load_weights``) and records
every call in :data:`CALLS`, so CPU tests can check what hpcppo *asks of* vLLM: the environment at construction,
the constructor arguments, the order of sleep / wake / weight sync / cache reset / generate calls, the prompts and
seeds each rank submits, the dtype and bucketing of streamed weights. Whether vLLM honours those requests is only
shown by the GPU tests (tests/gpu/test_vllm_engine.py).

Install it for a test with :func:`install` (``sys.modules["vllm"]`` and the few submodules the engine imports:
the layerwise reload it updates weights with and its per-layer counts, the embedding and MoE methods it
re-processes, the platform) and
:func:`reset`. Generation is a
deterministic function of (prompt, seed): a response of 1..max_tokens pseudo-random tokens that ends, when it ends
early, with the *last* of the request's ``stop_token_ids`` (as vLLM stops at a generation_config EOS id).
"""

from __future__ import annotations

import os
import random
import sys
import types
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

CALLS: list[tuple[Any, ...]] = []
"""Every call, in order: ``(name, details...)``."""

LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
VOCAB = 64


def reset() -> None:
    CALLS.clear()


def names() -> list[str]:
    """The call names only, in order."""
    return [c[0] for c in CALLS]


class SamplingParams:
    """Keeps its keyword arguments as attributes (vLLM's has many more; hpcppo passes these)."""

    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs
        for k, v in kwargs.items():
            setattr(self, k, v)


@dataclass
class Logprob:
    logprob: float


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]]


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)


class _Model(nn.Module):
    """Stands in for vLLM's model: ``load_weights`` records what arrives (names, dtypes, bucket sizes)."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))  # gives the model a device

    def load_weights(self, weights: Any) -> set[str]:
        got = [(name, tensor.dtype, tuple(tensor.shape), tensor.numel() * tensor.element_size())
               for name, tensor in weights]
        CALLS.append(("load_weights", got))
        return {name for name, *_ in got} | {"anchor"}


def _respond(prompt: list[int], seed: int | None, index: int, params: SamplingParams) -> CompletionOutput:
    rng = random.Random(f"{prompt}:{seed}:{index}")
    stops = list(params.stop_token_ids)
    length = rng.randint(1, params.max_tokens)
    tokens = [rng.randrange(VOCAB) for _ in range(length)]
    tokens = [t for t in tokens if t not in stops] or [1]
    if len(tokens) < params.max_tokens and stops:
        tokens.append(stops[-1])
    tokens = tokens[: params.max_tokens]
    return CompletionOutput(index=index, token_ids=tokens,
                            logprobs=[{t: Logprob(-0.01 * (j + 1))} for j, t in enumerate(tokens)])


class UnquantizedEmbeddingMethod:
    """vLLM's embedding method: the stand-in's model has no layer with it, so nothing is re-processed."""

    def process_weights_after_loading(self, layer: Any) -> None:
        CALLS.append(("process_embedding", type(layer).__name__))


def initialize_layerwise_reload(model: Any) -> None:
    CALLS.append(("initialize_layerwise_reload",))


def finalize_layerwise_reload(model: Any, model_config: Any) -> None:
    CALLS.append(("finalize_layerwise_reload", model_config))


class _Platform:
    """A GPU platform as far as the engine asks (no CPU shared-memory segments to clean up)."""

    @staticmethod
    def is_cpu() -> bool:
        return False


class UnquantizedFusedMoEMethod:
    """vLLM's MoE method: the stand-in's model has no MoE layer."""


class CPUUnquantizedExperts:
    """vLLM's CPU experts: never built here."""


def get_layerwise_info(layer: Any) -> Any:
    """Every layer of the stand-in is processed (nothing left loaded in part)."""
    return SimpleNamespace(can_load=lambda: False, load_numel=0, load_numel_total=None)


def is_deferred_attention_layer(layer: Any) -> bool:
    return False


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def modules() -> dict[str, Any]:
    """``sys.modules`` entries that make this stand-in importable as ``vllm`` with the submodules the engine uses."""
    return {
        "vllm": sys.modules[__name__],
        "vllm.model_executor": _module("vllm.model_executor"),
        "vllm.model_executor.layers": _module("vllm.model_executor.layers"),
        "vllm.model_executor.layers.vocab_parallel_embedding": _module(
            "vllm.model_executor.layers.vocab_parallel_embedding", UnquantizedEmbeddingMethod=UnquantizedEmbeddingMethod),
        "vllm.model_executor.model_loader": _module("vllm.model_executor.model_loader"),
        "vllm.model_executor.model_loader.reload": _module(
            "vllm.model_executor.model_loader.reload", initialize_layerwise_reload=initialize_layerwise_reload,
            finalize_layerwise_reload=finalize_layerwise_reload),
        "vllm.model_executor.model_loader.reload.layerwise": _module(
            "vllm.model_executor.model_loader.reload.layerwise", get_layerwise_info=get_layerwise_info),
        "vllm.model_executor.model_loader.reload.meta": _module(
            "vllm.model_executor.model_loader.reload.meta", SKIP_LOAD_TENSORS=set()),
        "vllm.model_executor.layers.attention": _module(
            "vllm.model_executor.layers.attention", is_deferred_attention_layer=is_deferred_attention_layer),
        "vllm.model_executor.layers.fused_moe": _module("vllm.model_executor.layers.fused_moe"),
        "vllm.model_executor.layers.fused_moe.experts": _module("vllm.model_executor.layers.fused_moe.experts"),
        "vllm.model_executor.layers.fused_moe.experts.cpu_moe": _module(
            "vllm.model_executor.layers.fused_moe.experts.cpu_moe", CPUUnquantizedExperts=CPUUnquantizedExperts),
        "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method": _module(
            "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method",
            UnquantizedFusedMoEMethod=UnquantizedFusedMoEMethod),
        "vllm.platforms": _module("vllm.platforms", current_platform=_Platform()),
    }


def install() -> None:
    """Put :func:`modules` into ``sys.modules`` (for the rest of the process)."""
    sys.modules.update(modules())


class LLM:
    def __init__(self, **kwargs: Any):
        env = {k: os.environ.get(k) for k in LAUNCHER_VARS}
        CALLS.append(("LLM", kwargs, env))
        self.kwargs = kwargs
        model = _Model()
        runner = SimpleNamespace(model=model)
        self.llm_engine = SimpleNamespace(
            model_config=SimpleNamespace(model=kwargs.get("model"), hf_config=SimpleNamespace(model_type="llama")),
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=SimpleNamespace(model_runner=runner))))

    def generate(self, prompts: list[dict[str, list[int]]], params: list[SamplingParams], use_tqdm: bool = True):
        rows = [list(p["prompt_token_ids"]) for p in prompts]
        CALLS.append(("generate", rows, [p.seed for p in params], [list(p.stop_token_ids) for p in params]))
        return [RequestOutput(prompt_token_ids=row, outputs=[_respond(row, p.seed, i, p) for i in range(p.n)])
                for row, p in zip(rows, params)]

    def sleep(self, level: int = 1) -> None:
        CALLS.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        CALLS.append(("wake_up", None if tags is None else list(tags)))

    def reset_prefix_cache(self) -> bool:
        CALLS.append(("reset_prefix_cache",))
        return True
