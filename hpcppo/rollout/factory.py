"""Build a rollout engine by name: each kind of :mod:`hpcppo.engines` (the torch-free registry the config and the sizing
read) has its builder here; the engines import their heavy libraries only when built (vLLM is optional)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcppo import engines
from hpcppo.rollout.base import RolloutEngine
from hpcppo.rollout.hf import HFRolloutEngine
from hpcppo.rollout.vllm_engine import VLLMRolloutEngine

ENGINE_KINDS = engines.names()

#: One builder per engine kind (a test checks they are the registry's kinds).
BUILDERS: dict[str, Callable[..., RolloutEngine]] = {
    "hf": HFRolloutEngine.from_pretrained,
    "vllm": VLLMRolloutEngine,
}


def build_engine(kind: str, **kwargs: Any) -> RolloutEngine:
    """Construct an engine by name: ``"hf"`` -> :class:`~hpcppo.rollout.hf.HFRolloutEngine.from_pretrained`,
    ``"vllm"`` -> :class:`~hpcppo.rollout.vllm_engine.VLLMRolloutEngine`. Keyword arguments go to that constructor.

    Raises ``ValueError`` naming the known kinds for anything else.
    """
    return BUILDERS[engines.lookup(kind).name](**kwargs)
