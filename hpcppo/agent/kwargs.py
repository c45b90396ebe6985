"""Per-row tool arguments: verl's ``extra_info.tools_kwargs`` (``{tool name: {create_kwargs, execute_kwargs,
calc_reward_kwargs, release_kwargs}}``, as verl's ``RLHFDataset.__getitem__`` passes it to the agent loop and
``ToolAgentLoop._call_tool`` reads ``create_kwargs`` from it, verl b178a3c; written by verl's
examples/data_preprocess/gsm8k_multiturn_w_tool.py: ``{"calc_gsm8k_reward": {"create_kwargs": {"ground_truth":
...}}}``).

Compile checks every row (:func:`tools_kwargs_problems`, through ``hpcppo.compiler``): only configured tools and
known phases, each a mapping, and only argument names the tool's method of that phase takes
(:func:`unaccepted_names`). The rollout loop takes a row's arguments for one tool with :func:`row_tool_kwargs` and
passes each phase's to the tool's method (:data:`PHASE_METHODS`) as keyword arguments (docs/tools.md, "Per-row tool
arguments").

A value of ``None`` counts as absent at every level: Parquet stores ``extra_info`` as one struct type for all rows,
so a tool (or a phase) one row names is a null field in every other row.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PHASES", "PHASE_METHODS", "ToolKwargs", "row_tool_kwargs", "tools_kwargs_problems", "unaccepted_names",
           "TOOLS_KWARGS_KEY"]

#: The key of ``extra_info`` that holds them.
TOOLS_KWARGS_KEY = "tools_kwargs"
#: The phases of a tool's life that a row may give arguments to (verl's names).
PHASES = ("create_kwargs", "execute_kwargs", "calc_reward_kwargs", "release_kwargs")
#: Each phase's ``Tool`` method and how many of its parameters after ``self`` the loop fills by position
#: (``instance_id``; ``execute`` also ``parameters``).
PHASE_METHODS = {"create_kwargs": ("create", 1), "execute_kwargs": ("execute", 2),
                 "calc_reward_kwargs": ("calc_reward", 1), "release_kwargs": ("release", 1)}


@dataclass(frozen=True)
class ToolKwargs:
    """One row's arguments for one tool, per phase (empty when the row gives none): ``create`` goes to
    ``Tool.create(instance_id, **create)`` (e.g. a ground truth: ``hpcppo.agent.builtin.Gsm8kAnswer``), ``execute``
    to every ``Tool.execute(instance_id, parameters, **execute)``, ``calc_reward`` and ``release`` to those methods
    at the trajectory's end."""

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


def unaccepted_names(method: Callable[..., Any], positional: int, names: Collection[str]) -> list[str]:
    """Which of ``names`` the function ``method`` (a ``Tool`` method, ``self`` first) cannot take as keyword
    arguments after its first ``positional`` parameters after ``self`` are filled by position."""
    try:
        params = list(inspect.signature(method).parameters.values())[1 + positional:]
    except (TypeError, ValueError):  # no signature to read: let the call decide
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        taken = {p.name for p in list(inspect.signature(method).parameters.values())[1:1 + positional]}
        return [n for n in names if n in taken]
    keywords = {p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                      inspect.Parameter.KEYWORD_ONLY)}
    return [n for n in names if n not in keywords]


def tools_kwargs_problems(value: Any, tools: Collection[str], classes: Mapping[str, type] | None = None) -> list[str]:
    """What is wrong with one row's ``extra_info.tools_kwargs`` given the configured tool names, one phrase each:
    a value that is not a mapping, a tool not configured, a phase not in :data:`PHASES`, a phase's arguments that
    are not a mapping; with ``classes`` (tool name -> its class), an argument the phase's method does not take."""
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
                elif classes is not None and name in classes:
                    cls = classes[name]
                    method, positional = PHASE_METHODS[phase]
                    bad = unaccepted_names(getattr(cls, method), positional, list(_present(kwargs)))
                    if bad:
                        problems.append(f"{key}.{name}.{phase} gives {', '.join(map(repr, bad))}, which "
                                        f"{cls.__module__}.{cls.__qualname__}.{method} does not take as a keyword "
                                        f"argument")
    return problems
