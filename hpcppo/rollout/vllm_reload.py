"""vLLM's in-place layerwise reload as the vLLM engine's ``sync_weights`` uses it, and the checks around it.

The places that reach into vLLM internals (read at vLLM 0.32.0): the reload's three calls, the re-processing of
tied embeddings, the CPU mixture-of-experts kernel that the reload does not re-pack, and the per-layer counts of
loaded elements that tell a layer loaded in part. vLLM itself is imported inside the functions, as in
``hpcppo.rollout.vllm_engine``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import torch


class IncompleteSync(KeyError):
    """vLLM's model did not receive every parameter, or some layer received only part of its elements."""

    def __str__(self) -> str:  # KeyError's str() would quote the message
        return str(self.args[0])


def reload_in_place(model: torch.nn.Module, model_config: Any,
                    buckets: Iterable[Iterable[tuple[str, torch.Tensor]]]) -> set[str] | None:
    """Load ``buckets`` of ``(name, tensor)`` into ``model`` the way vLLM reloads weights in place; returns the
    names ``load_weights`` reported (None when it reports none). Raises :class:`IncompleteSync` when a layer
    received only part of its elements (after leaving every layer in kernel format).

    The three calls are those of vLLM's own in-place reload (``reload_weights`` in
    vllm/model_executor/model_loader/reload/inplace.py, which ``model_runner.reload_weights`` wraps) and of its RL
    weight-transfer engines (``start_weight_update`` / ``finish_weight_update`` in
    vllm/distributed/weight_transfer/{nccl,ipc}_engine.py): ``initialize_layerwise_reload`` puts every layer back
    in checkpoint format on the meta device and wraps its loaders; each layer is materialised, loaded and
    post-processed (``process_weights_after_loading``) once all of its weights have arrived (``load_numel`` reaches
    ``load_numel_total``: ``make_online_process_loader`` in reload/layerwise.py), and copied into the storage the
    engine already uses; ``finalize_layerwise_reload`` processes what was left, a layer loaded in part included
    ("Delayed processing") -- which is why the counts are read before it (:func:`_incomplete_layers`).
    ``reload_weights`` itself takes a single iterator and does not say what it loaded, hence the calls here.

    Tied embeddings: the reload's documented limitation (2) in vllm/model_executor/model_loader/reload/__init__.py
    is that a tied parameter is processed for one of its layers only. On CPU the LM head's processing builds a
    prepacked copy of the (tied) embedding (``UnquantizedEmbeddingMethod.process_weights_after_loading`` ->
    ``dispatch_cpu_unquantized_gemm(layer, remove_weight=False)``, vllm/model_executor/layers/
    vocab_parallel_embedding.py and layers/utils.py), and the reload never rebuilds it: the logits stayed those of
    the first weights (measured: 0 of 16 greedy rows right after a sync, 16 of 16 with the re-processing below).
    Embedding layers keep their weight on every platform (``remove_weight=False``), so processing them again is
    safe; on GPU it is a no-op. Mixture-of-experts layers on CPU: :func:`_repack_cpu_experts`.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    loaded: set[str] | None = set()
    _repack_cpu_experts(model)
    tied = _tied_layers(model)
    initialize_layerwise_reload(model)
    try:
        for bucket in buckets:
            names = cast(Any, model).load_weights(bucket)  # vLLM's model class, not typed as one
            if names is None:
                loaded = None
            elif loaded is not None:
                loaded |= set(names)
        partial = _incomplete_layers(model, tied)
    finally:
        # Always leave the model in kernel format: a failed sync must not leave layers on the meta device.
        finalize_layerwise_reload(model, model_config)
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedEmbeddingMethod):
            method.process_weights_after_loading(module)
    if partial:
        raise IncompleteSync(f"sync_weights: {len(partial)} vLLM layers received only part of their weights: "
                             + ", ".join(partial[:5]))
    return loaded


def _repack_cpu_experts(model: torch.nn.Module) -> list[str]:
    """Make the reload re-pack the experts of each unquantized MoE layer on vLLM's CPU backend; returns their names.

    Why: ``UnquantizedFusedMoEMethod._setup_kernel`` (vllm/model_executor/layers/fused_moe/
    unquantized_fused_moe_method.py) builds the MoE kernel on the first ``process_weights_after_loading`` and then
    calls ``moe_kernel.fused_experts.process_weights_after_loading(layer)``, which on CPU re-lays ``w13_weight`` and
    ``w2_weight`` out for its grouped GEMM (``CPUUnquantizedExperts.process_weights_after_loading`` ->
    ``cpu_prepack_moe_weight``, layers/fused_moe/experts/cpu_moe.py). On a weight update (``moe_kernel`` already
    set) it copies the new weights in place and skips that step, so the reload copied checkpoint-layout experts
    into storage the kernel reads as prepacked: measured on a tiny Qwen3-MoE, 0 of 16 greedy rows equal to
    transformers' after a sync, whatever names the experts arrived under (fused or per expert), 16 of 16 with the
    kernel dropped here so that the reload's processing runs the first-load path (kernel and prepack) on the new
    weights before copying them into the engine's storage. Only on CPU: the GPU path's ``fused_experts`` has no
    such step for unquantized weights, and its kernel may be captured in CUDA graphs.
    """
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    reset = []
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        kernel = getattr(method, "moe_kernel", None)
        if isinstance(method, UnquantizedFusedMoEMethod) and isinstance(
                getattr(kernel, "fused_experts", None), CPUUnquantizedExperts):
            method.moe_kernel = None
            reset.append(name)
    return reset


def _tied_layers(model: torch.nn.Module) -> set[str]:
    """Names of the layers whose own parameters all belong to another layer too (a tied LM head): the reload loads
    a tied parameter through one of its layers only (limitation (2) of vllm/model_executor/model_loader/reload)."""
    owners: dict[int, list[str]] = {}
    for name, layer in model.named_modules():
        for param in layer.parameters(recurse=False):
            owners.setdefault(id(param), []).append(name)
    return {name for name, layer in model.named_modules()
            if any(True for _ in layer.parameters(recurse=False))
            and all(len(owners[id(p)]) > 1 for p in layer.parameters(recurse=False))}


def _incomplete_layers(model: torch.nn.Module, tied: set[str]) -> list[str]:
    """``name loaded/total`` of each layer with parameters that the reload has not processed because it received
    fewer elements than it holds (``LayerReloadingInfo.load_numel`` < ``load_numel_total``, reload/types.py; a
    processed layer's info is reset, ``can_load()`` False). A layer without parameters of its own (rotary
    caches), whose parameters are tied to another layer's (``tied``: loaded through that one), or whose processing
    vLLM defers to the end (attention: ``is_deferred_attention_layer``) is skipped.
    The names of ``load_weights`` cannot tell this: a fused-experts parameter is reported as loaded as soon as one
    expert's slice arrives."""
    from vllm.model_executor.layers.attention import is_deferred_attention_layer
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info
    from vllm.model_executor.model_loader.reload.meta import SKIP_LOAD_TENSORS

    partial = []
    for name, layer in model.named_modules():
        own = [p for n, p in layer.named_parameters(recurse=False) if n not in SKIP_LOAD_TENSORS]
        if not own or name in tied or is_deferred_attention_layer(layer):
            continue
        info = get_layerwise_info(layer)
        if info.can_load() and info.load_numel < cast(int, info.load_numel_total):
            partial.append(f"{name} {info.load_numel}/{info.load_numel_total} elements")
    return partial
