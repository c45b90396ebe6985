"""Rollout engine kinds by name, and what each is: the torch-free half of :mod:`hpcppo.rollout.factory`.

The config compiler runs on login nodes without torch; it validates ``rollout.engine`` against the names declared
here and takes from them what the engine asks of the job (vLLM installed, a sleep mode, tensor parallelism, what it
refuses on the CPU); :mod:`hpcppo.sizing` sizes its memory and time by the same properties, and
:mod:`hpcppo.rollout.factory` builds one per name. A new engine is a row here and one engine module (with its
builder in the factory).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ENGINES", "EngineKind", "lookup", "names"]


@dataclass(frozen=True)
class EngineKind:
    """What a rollout engine is, as the config and the sizing see it."""

    name: str
    label: str
    """How messages name it."""
    needs_vllm: bool = False
    """The job's Python must have vLLM (compile looks for it where the job runs this very interpreter)."""
    sleeps: bool = False
    """It has a sleep mode (``rollout.free_cache_engine``) that frees its weights and KV cache during the updates."""
    sleeps_on_cpu: bool = True
    """Its sleep mode also works on the CPU (False: a CPU site must set ``rollout.free_cache_engine = false``)."""
    kv_cache_share: bool = False
    """Its memory is a share of the GPU reserved at start-up (``gpu_memory_utilization``, or weights plus
    ``kv_cache_memory_mb``), its KV cache sized from what is left; False: the KV cache of each batch, as it generates."""
    tensor_parallel: bool = False
    """``rollout.tensor_parallel_size`` > 1 is possible."""
    timed_weight_sync: bool = False
    """``hpcppo plan`` times its weight sync (the actor all-gathered into the engine's copy every step)."""


#: Every engine kind, in the order the config lists them.
ENGINES: dict[str, EngineKind] = {
    "hf": EngineKind("hf", "hf"),
    "vllm": EngineKind("vllm", "vLLM", needs_vllm=True, sleeps=True, sleeps_on_cpu=False, kv_cache_share=True,
                       tensor_parallel=True, timed_weight_sync=True),
}


def lookup(name: str) -> EngineKind:
    """The engine kind ``name``; ``ValueError`` naming the known ones."""
    kind = ENGINES.get(name)
    if kind is None:
        raise ValueError(f"unknown rollout engine {name!r}; known engines: {', '.join(ENGINES)}")
    return kind


def names() -> tuple[str, ...]:
    """The engine names, in the config's order."""
    return tuple(ENGINES)
