"""Per-row tool arguments: verl's ``extra_info.tools_kwargs`` (``{tool name: {create_kwargs, execute_kwargs,
calc_reward_kwargs, release_kwargs}}``, as verl's ``RLHFDataset.__getitem__`` passes it to the agent loop and
``ToolAgentLoop._call_tool`` reads ``create_kwargs`` from it, verl b178a3c; written by verl's
examples/data_preprocess/gsm8k_multiturn_w_tool.py: ``{"calc_gsm8k_reward": {"create_kwargs": {"ground_truth":
...}}}``).

Compile checks every row (:func:`tools_kwargs_problems`, through ``hpcppo.compiler``): only configured tools and
known phases, each a mapping. The rollout loop takes a row's arguments for one tool with :func:`row_tool_kwargs`.

A value of ``None`` counts as absent at every level: Parquet stores ``extra_info`` as one struct type for all rows,
so a tool (or a phase) one row names is a null field in every other row.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PHASES", "ToolKwargs", "row_tool_kwargs", "tools_kwargs_problems", "TOOLS_KWARGS_KEY"]

#: The key of ``extra_info`` that holds them.
TOOLS_KWARGS_KEY = "tools_kwargs"
#: The phases of a tool's life that a row may give arguments to (verl's names).
PHASES = ("create_kwargs", "execute_kwargs", "calc_reward_kwargs", "release_kwargs")


@dataclass(frozen=True)
class ToolKwargs:
    """One row's arguments for one tool, per phase (empty when the row gives none): ``create`` goes to
    ``Tool.create(**create)`` (e.g. a ground truth: ``hpcppo.agent.builtin.Gsm8kAnswer``)."""

    create: dict[str, Any] = field(default_factory=dict)
    execute: dict[str, Any] = field(default_factory=dict)
    calc_reward: dict[str, Any] = field(default_factory=dict)
    release: dict[str, Any] = field(default_factory=dict)


def _present(mapping: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if v is not None}


def row_tool_kwargs(extra_info: Mapping[str, Any] | None, tool: str) -> ToolKwargs:
    """The arguments a row (its ``extra_info``, as ``PromptRecord.extra_info`` holds it) gives the tool named
    ``tool`` (its schema's name). Compile has checked the shape (:func:`tools_kwargs_problems`); a row that gives
    nothing gets empty mappings."""
    per_tool = (extra_info or {}).get(TOOLS_KWARGS_KEY) or {}
    phases = per_tool.get(tool) or {}
    return ToolKwargs(**{phase.removesuffix("_kwargs"): _present(phases.get(phase) or {}) for phase in PHASES})


def tools_kwargs_problems(value: Any, tools: Collection[str]) -> list[str]:
    """What is wrong with one row's ``extra_info.tools_kwargs`` given the configured tool names, one phrase each:
    a value that is not a mapping, a tool not configured, a phase not in :data:`PHASES`, a phase's arguments that
    are not a mapping."""
    if value is None:
        return []
    key = f"extra_info.{TOOLS_KWARGS_KEY}"
    if not isinstance(value, Mapping):
        return [f"{key} must be a mapping {{tool name: {{create_kwargs: {{...}}, ...}}}}, not {type(value).__name__}"]
    problems = []
    allowed = ", ".join(sorted(tools)) or "none"
    for name, phases in _present(value).items():
        if name not in tools:
            problems.append(f"{key} names tool {name!r}, which is not configured (configured: {allowed})")
        elif not isinstance(phases, Mapping):
            problems.append(f"{key}.{name} must be a mapping of {', '.join(PHASES)}, not {type(phases).__name__}")
        else:
            for phase, kwargs in _present(phases).items():
                if phase not in PHASES:
                    problems.append(f"{key}.{name} has unknown phase {phase!r}; allowed: {', '.join(PHASES)}")
                elif not isinstance(kwargs, Mapping):
                    problems.append(f"{key}.{name}.{phase} must be a mapping of arguments, not "
                                    f"{type(kwargs).__name__}")
    return problems
