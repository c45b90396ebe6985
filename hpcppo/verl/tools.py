"""verl's tool config YAML (``actor_rollout_ref.rollout.multi_turn.tool_config_path``: ``tools: [{class_name, config,
tool_schema}]``, read by verl's ``initialize_tools_from_config`` in verl/tools/utils/tool_registry.py at b178a3c) as
``[[rollout.multi_turn.tools]]`` entries for ``hpcppo import-verl``.

verl's tool classes are ``async`` and return verl's types, so they do not load here: the built-in ones that have an
hpcppo equivalent (:data:`VERL_TOOL_CLASSES`) are replaced by it, classes already written against hpcppo's interface
(``hpcppo.*``) are kept, and every other class is named in one line, to be rewritten (docs/tools.md). No torch, no
tool imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcppo.errors import ConfigError
from hpcppo.verl.read import load_yaml

__all__ = ["VERL_TOOL_CLASSES", "TranslatedTools", "translate_tool_config"]

#: verl's built-in tool classes and their hpcppo equivalents.
VERL_TOOL_CLASSES = {"verl.tools.gsm8k_tool.Gsm8kTool": "hpcppo.agent.builtin.Gsm8kAnswer"}
_HPCPPO_PREFIX = "hpcppo."


@dataclass
class TranslatedTools:
    """The entries written (``class_name``, ``config``, ``tool_schema``), the verl classes replaced (verl -> hpcppo),
    and the problems: one line each, for the report."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    replaced: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def translate_tool_config(path: Path) -> TranslatedTools:
    """Read verl's tool YAML at ``path`` and translate its entries. Raises ConfigError (one line) when the file
    cannot be read or is not a tool config; a class without an hpcppo equivalent is a problem, not an error."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read verl's tool config: {getattr(exc, 'strerror', None) or exc}",
                          file=str(path)) from None
    data = load_yaml(text, str(path))
    entries = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ConfigError("not a verl tool config: needs a list `tools:` of {class_name, config, tool_schema}",
                          file=str(path))
    out = TranslatedTools()
    unknown: list[str] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
            out.problems.append(f"{path}: tools[{i}] has no class_name")
            continue
        verl_class = entry["class_name"]
        config = dict(entry.get("config") or {})
        kind = config.pop("type", "native")
        if kind != "native":
            out.problems.append(f"{path}: tools[{i}] ({verl_class}) is an {kind!r} tool; hpcppo runs native tools "
                                f"only (MCP servers are not supported)")
            continue
        if verl_class in VERL_TOOL_CLASSES:
            class_name = out.replaced[verl_class] = VERL_TOOL_CLASSES[verl_class]
        elif verl_class.startswith(_HPCPPO_PREFIX):
            class_name = verl_class
        else:
            unknown.append(verl_class)
            continue
        out.tools.append({"class_name": class_name, "config": config, "tool_schema": dict(entry.get("tool_schema")
                                                                                           or {})})
    if unknown:
        known = ", ".join(VERL_TOOL_CLASSES)
        out.problems.append(f"{path}: tool classes without an hpcppo equivalent: {', '.join(unknown)} (verl's tools "
                            f"are async and return verl types; write them against hpcppo.agent.tool.Tool, "
                            f"docs/tools.md, and add them as [[rollout.multi_turn.tools]]; translated: {known})")
    return out
