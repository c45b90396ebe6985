"""Build a rollout engine by name: each kind of :mod:`hpcppo.engines` (the torch-free registry the config and the sizing
read) has its builder here; the engines import their heavy libraries only when built (vLLM is optional)."""

from __future__ import annotations

from collections.abc import Callable

from hpcppo import engines
from hpcppo.rollout.base import EngineSettings, RolloutEngine
from hpcppo.rollout.hf import HFRolloutEngine
from hpcppo.rollout.vllm_engine import VLLMRolloutEngine

ENGINE_KINDS = engines.names()

#: One builder per engine kind (a test checks they are the registry's kinds).
BUILDERS: dict[str, Callable[[EngineSettings], RolloutEngine]] = {
    "hf": HFRolloutEngine.from_settings,
    "vllm": VLLMRolloutEngine.from_settings,
}


def build_engine(kind: str, settings: EngineSettings) -> RolloutEngine:
    """Construct an engine by name from the run's :class:`~hpcppo.rollout.base.EngineSettings`: each kind's
    ``from_settings`` takes what it uses (``"hf"`` -> :class:`~hpcppo.rollout.hf.HFRolloutEngine`, ``"vllm"`` ->
    :class:`~hpcppo.rollout.vllm_engine.VLLMRolloutEngine`).

    Raises ``ValueError`` naming the known kinds for anything else.
    """
    return BUILDERS[engines.lookup(kind).name](settings)
