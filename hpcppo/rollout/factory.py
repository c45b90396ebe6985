"""Build a rollout engine by name; the engines themselves are imported only when chosen (vLLM is optional)."""

from __future__ import annotations

from typing import Any

from hpcppo.rollout.base import RolloutEngine
from hpcppo.rollout.hf import HFRolloutEngine
from hpcppo.rollout.vllm_engine import VLLMRolloutEngine

ENGINE_KINDS = ("hf", "vllm")


def build_engine(kind: str, **kwargs: Any) -> RolloutEngine:
    """Construct an engine by name: ``"hf"`` -> :class:`~hpcppo.rollout.hf.HFRolloutEngine.from_pretrained`,
    ``"vllm"`` -> :class:`~hpcppo.rollout.vllm_engine.VLLMRolloutEngine`. Keyword arguments go to that constructor.

    Raises ``ValueError`` naming the known kinds for anything else.
    """
    if kind == "hf":
        return HFRolloutEngine.from_pretrained(**kwargs)
    if kind == "vllm":
        return VLLMRolloutEngine(**kwargs)
    raise ValueError(f"unknown rollout engine {kind!r}; known engines: {', '.join(ENGINE_KINDS)}")
