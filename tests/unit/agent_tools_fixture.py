"""Tools for the tool-worker tests: one that raises, one that crashes its process, one that hangs, one with state."""

from __future__ import annotations

import os
import time
from typing import Any

from hpcppo.agent.tool import Tool


def _schema(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": []}}}


class Raises(Tool):
    default_schema = _schema("raises")

    def execute(self, instance_id: str, parameters: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        raise ValueError("bug in the tool")


class Crashes(Tool):
    default_schema = _schema("crashes")

    def execute(self, instance_id: str, parameters: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        os._exit(3)


class Hangs(Tool):
    default_schema = _schema("hangs")

    def execute(self, instance_id: str, parameters: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        time.sleep(3600)
        return "", 0.0, {}


class Counter(Tool):
    """Per-trajectory state: the sum of x over the calls; the reward is the sum."""

    default_schema = _schema("counter")

    def create(self, instance_id: str | None = None, **kw: Any) -> str:
        iid = super().create(instance_id, **kw)
        self._instances[iid]["sum"] = int(kw.get("start", 0))
        return iid

    def execute(self, instance_id: str, parameters: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        self._instances[instance_id]["sum"] += int(parameters.get("x", 0))
        return f"sum={self._instances[instance_id]['sum']} pid={os.getpid()}", 0.5, {"n": 1.0}

    def calc_reward(self, instance_id: str) -> float:
        return float(self._instances[instance_id]["sum"])


class Echo(Tool):
    """Says its integer back: ``echo N``."""

    default_schema = {"type": "function", "function": {"name": "echo", "description": "says n back", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}

    def execute(self, instance_id: str, parameters: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        return f"echo {parameters['n']}", 0.0, {}


class BadCtor(Tool):
    default_schema = _schema("badctor")

    def __init__(self, config: dict[str, Any], tool_schema: dict[str, Any] | None):
        raise RuntimeError("no such resource")


class Modules(Tool):
    """Which heavy modules the worker process has imported."""

    default_schema = _schema("modules")

    def execute(self, instance_id: str, parameters: dict[str, Any]) -> tuple[str, float, dict[str, float]]:
        import sys

        return ",".join(m for m in ("torch", "transformers", "agent_owner_heavy") if m in sys.modules), 0.0, {}


NotATool = dict
