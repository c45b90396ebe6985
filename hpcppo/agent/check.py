"""Compile's look at the configured tools, on the login node (no torch, no tool constructed): every class imports
and is a Tool, every schema is valid, no two tools share a name. One line per problem."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpcppo.agent.parse import compact_problems
from hpcppo.agent.schema import schema_problems, tool_name
from hpcppo.agent.tool import ToolLoadError, ToolSpec, load_tool_class, read_tool_config

__all__ = ["tool_problems", "collect_specs", "tool_schemas"]


def collect_specs(entries: Sequence[tuple[str, dict[str, Any], dict[str, Any]]],
                  tool_config_path: str) -> list[ToolSpec]:
    """The TOML entries (class_name, config, tool_schema; {} = the class's own), then the YAML's."""
    specs = [ToolSpec(c, dict(cfg), dict(schema) or None) for c, cfg, schema in entries]
    if tool_config_path:
        specs += read_tool_config(tool_config_path)  # ToolLoadError on a bad file
    return specs


def tool_problems(specs: Sequence[ToolSpec], fmt: str = "hermes") -> list[str]:
    """One line per problem: import error, missing class, not a Tool, bad or missing schema, a config the class
    refuses (``Tool.config_problems``), duplicate name; with ``fmt`` compact, what that format cannot call."""
    problems: list[str] = []
    names: dict[str, int] = {}
    for i, spec in enumerate(specs):
        where = f"tools[{i}] ({spec.class_name})"
        try:
            cls = load_tool_class(spec.class_name)
        except ToolLoadError as exc:
            problems.append(f"{where}: {exc}")
            continue
        schema = spec.tool_schema if spec.tool_schema is not None else cls.default_schema
        if schema is None:
            problems.append(f"{where}: no tool_schema given and the class has no default_schema")
            continue
        bad = schema_problems(schema)
        if bad:
            problems.append(f"{where}: bad tool_schema: {'; '.join(bad)}")
            continue
        if fmt == "compact" and compact_problems(schema):
            problems.append(f"{where}: {'; '.join(compact_problems(schema))}")
        bad = cls.config_problems(dict(spec.config))
        if bad:
            problems.append(f"{where}: bad config: {'; '.join(bad)}")
        name = tool_name(schema)
        if name in names:
            problems.append(f"{where}: tool name {name!r} is also tools[{names[name]}]'s; names must be unique")
        names[name] = i
    return problems


def tool_schemas(specs: Sequence[ToolSpec]) -> dict[str, dict[str, Any]]:
    """Each tool's schema by its name (the configured one, else the class's ``default_schema``), in config order;
    for the rollout loop's parsing. Assumes :func:`tool_problems` found nothing (ToolLoadError otherwise)."""
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        schema = spec.tool_schema if spec.tool_schema is not None else load_tool_class(spec.class_name).default_schema
        if schema is None:
            raise ToolLoadError(f"class_name {spec.class_name!r}: no tool_schema given and the class has no "
                                "default_schema")
        out[tool_name(schema)] = schema
    return out
