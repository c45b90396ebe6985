"""The tool interface, with the shape of verl's ``BaseTool`` (verl/tools/base_tool.py at b178a3c), synchronous:
the tool worker process (:mod:`hpcppo.agent.worker`) calls it, one call at a time.

- ``__init__(config, tool_schema)``: the tool's ``config`` table and its OpenAI function schema (``None``: the
  class's own ``default_schema``, as verl's ``tool_schema or self.get_openai_tool_schema()``).
- ``create(instance_id=None, **create_kwargs) -> instance_id``: state for one trajectory.
- ``execute(instance_id, parameters, **execute_kwargs) -> (text, step_reward, metrics)``: one call; verl returns a
  ``ToolResponse``, here the text (tools are text-only).
- ``calc_reward(instance_id, **calc_reward_kwargs) -> float`` and ``release(instance_id, **release_kwargs)``.

The keyword arguments of each phase are a row's ``extra_info.tools_kwargs.<tool>.<phase>_kwargs``
(:mod:`hpcppo.agent.kwargs`), passed flat as verl's ``BaseTool`` methods take ``**kwargs``; a tool that takes none
keeps the two- and one-argument forms (a row that gives it none passes nothing).

Tools are loaded by import path (``package.module.ClassName``, as verl's ``get_tool_class`` in
verl/tools/utils/tool_registry.py) from a TOML list or verl's ``tool_config_path`` YAML (``tools: [{class_name,
config, tool_schema}]``).
"""

from __future__ import annotations

import importlib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hpcppo.agent.schema import schema_problems, tool_name

__all__ = ["Tool", "ToolSpec", "ToolLoadError", "load_tool_class", "read_tool_config", "build_tool"]


class ToolLoadError(Exception):
    """A tool cannot be loaded: its import, its class, its schema or its constructor. One line."""


class Tool:
    """Base class of a tool: override ``execute`` (and ``create``/``release`` for per-trajectory state)."""

    #: The schema used when the configuration gives none.
    default_schema: ClassVar[dict[str, Any] | None] = None

    def __init__(self, config: dict[str, Any], tool_schema: dict[str, Any] | None):
        self.config = dict(config)
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        self.name = tool_name(self.tool_schema)
        self._instances: dict[str, dict[str, Any]] = {}

    @classmethod
    def config_problems(cls, config: dict[str, Any]) -> list[str]:
        """What is wrong with a ``config`` table, one phrase each; compile asks, without constructing the tool."""
        return []

    def get_openai_tool_schema(self) -> dict[str, Any]:
        if self.default_schema is None:
            raise ToolLoadError(f"{type(self).__name__} has no default_schema: give its tool_schema in the config")
        return self.default_schema

    def create(self, instance_id: str | None = None, **create_kwargs: Any) -> str:
        instance_id = instance_id or uuid.uuid4().hex
        self._instances[instance_id] = dict(create_kwargs)
        return instance_id

    def execute(self, instance_id: str, parameters: dict[str, Any],
                **execute_kwargs: Any) -> tuple[str, float, dict[str, float]]:
        raise NotImplementedError(f"{type(self).__name__}.execute")

    def calc_reward(self, instance_id: str, **calc_reward_kwargs: Any) -> float:
        return 0.0

    def release(self, instance_id: str, **release_kwargs: Any) -> None:
        self._instances.pop(instance_id, None)


@dataclass(frozen=True)
class ToolSpec:
    """One configured tool: ``class_name`` (an import path), its ``config`` and its ``tool_schema`` (or None)."""

    class_name: str
    config: dict[str, Any] = field(default_factory=dict)
    tool_schema: dict[str, Any] | None = None


def load_tool_class(class_name: str) -> type[Tool]:
    """Import ``package.module.ClassName``; a ``Tool`` subclass, or ToolLoadError naming what went wrong."""
    module_name, _, attr = class_name.rpartition(".")
    if not module_name or not attr.isidentifier():
        raise ToolLoadError(f"class_name {class_name!r} must be an import path: package.module.ClassName")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure of the user's module is reported in one line
        raise ToolLoadError(f"class_name {class_name!r}: cannot import {module_name}: "
                            f"{type(exc).__name__}: {exc}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise ToolLoadError(f"class_name {class_name!r}: module {module_name} has no class {attr}")
    if not (isinstance(cls, type) and issubclass(cls, Tool)):
        raise ToolLoadError(f"class_name {class_name!r} is not a subclass of hpcppo.agent.tool.Tool")
    return cls


def build_tool(spec: ToolSpec) -> Tool:
    """Import and construct one tool, its schema checked."""
    cls = load_tool_class(spec.class_name)
    schema = spec.tool_schema if spec.tool_schema is not None else cls.default_schema
    if schema is None:
        raise ToolLoadError(f"class_name {spec.class_name!r}: no tool_schema given and the class has no default_schema")
    problems = schema_problems(schema)
    if problems:
        raise ToolLoadError(f"class_name {spec.class_name!r}: bad tool_schema: {'; '.join(problems)}")
    try:
        return cls(dict(spec.config), schema)
    except ToolLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's constructor
        raise ToolLoadError(f"class_name {spec.class_name!r}: constructor failed: {type(exc).__name__}: {exc}") from None


def read_tool_config(path: str | Path) -> list[ToolSpec]:
    """verl's ``tool_config_path`` YAML: ``tools: [{class_name, config, tool_schema}]``. ToolLoadError on a bad file."""
    import yaml  # PyYAML, only when a YAML tool config is named

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ToolLoadError(f"{path}: cannot read the tool config: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    tools = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(tools, list):
        raise ToolLoadError(f"{path}: needs a list `tools:` of {{class_name, config, tool_schema}}")
    specs = []
    for i, entry in enumerate(tools):
        if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
            raise ToolLoadError(f"{path}: tools[{i}] needs class_name (an import path)")
        unknown = sorted(set(entry) - {"class_name", "config", "tool_schema"})
        if unknown:
            raise ToolLoadError(f"{path}: tools[{i}] has unknown keys {unknown}; allowed: class_name, config, tool_schema")
        config = dict(entry.get("config") or {})
        config.pop("type", None)  # verl's `type: native`; MCP tools are not supported (below)
        if (entry.get("config") or {}).get("type", "native") != "native":
            raise ToolLoadError(f"{path}: tools[{i}]: only native tools are supported (config.type = native), "
                                f"not {entry['config']['type']!r}")
        specs.append(ToolSpec(entry["class_name"], config, entry.get("tool_schema")))
    return specs
