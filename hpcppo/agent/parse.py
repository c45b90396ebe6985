"""Tool calls in a model's text, in two formats; each call checked against the tools' schemas.

- ``hermes`` (verl's ``HermesToolParser`` in verl/experimental/agent_loop/tool_parser.py at b178a3c):
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number per turn, the content being the text
  with the calls removed. ``arguments`` may also be a JSON string holding an object (as OpenAI's API sends it).
- ``compact``, for the tiny character tokenizer (no braces, no quotes, no underscore): ``<call>NAME(ARGS)</call>``
  where ARGS is ``key=value, key=value`` split at commas outside parentheses, or a bare value for a tool with
  exactly one parameter (``<call>calculator((12+3)*4)</call>``). Values are typed by the schema: integer, number,
  boolean (``true``/``false``), string (the text, stripped); arrays and objects cannot be written.
  ``<call>`` and ``</call>`` are one token each in the tokenizer that uses it.

Where verl differs: verl silently drops a call it cannot decode and keeps calls past ``max_parallel_calls`` out
without a word; here each becomes an error (:class:`CallError`) the rollout turns into an error observation, so
that the model learns what went wrong. A call inside a Markdown code fence (```...```) is text shown, not a call,
and is left in the content (verl's regex would run it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from hpcppo.agent.schema import argument_problems

__all__ = ["FORMATS", "ToolCall", "CallError", "Parsed", "parse_calls", "HERMES_START", "HERMES_END",
           "COMPACT_START", "COMPACT_END", "compact_problems"]

HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
COMPACT_START, COMPACT_END = "<call>", "</call>"
FORMATS = ("hermes", "compact")
_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_HERMES = re.compile(re.escape(HERMES_START) + r"(.*?)" + re.escape(HERMES_END), re.DOTALL)
_COMPACT = re.compile(re.escape(COMPACT_START) + r"(.*?)" + re.escape(COMPACT_END), re.DOTALL)
_COMPACT_NAME = r"[a-z][a-z0-9-]*"
_COMPACT_KEY = r"[a-z][a-z0-9]*"
_COMPACT_CALL = re.compile(r"\s*(" + _COMPACT_NAME + r")\((.*)\)\s*", re.DOTALL)
_COMPACT_TYPES = ("string", "integer", "number", "boolean")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class CallError:
    """A call that is not run. ``kind``: malformed, unknown_tool, bad_arguments, too_many."""

    kind: str
    message: str
    name: str = ""


@dataclass
class Parsed:
    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[CallError] = field(default_factory=list)


def _outside_fences(text: str, pattern: re.Pattern[str]) -> list[re.Match[str]]:
    fences = [(m.start(), m.end()) for m in _FENCE.finditer(text)]
    return [m for m in pattern.finditer(text) if not any(a <= m.start() < b for a, b in fences)]


def _hermes(body: str) -> tuple[str, Any] | CallError:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return CallError("malformed", f"the tool call is not valid JSON: {exc.msg} at character {exc.pos}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return CallError("malformed", "the tool call must be an object with a \"name\" and \"arguments\"")
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return CallError("malformed", "\"arguments\" is a string that is not a JSON object", obj["name"])
    return obj["name"], args


def _split_top(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _typed(kind: str, raw: str) -> Any:
    if kind == "integer":
        return int(raw)
    if kind == "number":
        return float(raw)
    if kind == "boolean":
        if raw not in ("true", "false"):
            raise ValueError(raw)
        return raw == "true"
    if kind == "string":
        return raw
    raise ValueError(f"a {kind} cannot be written in the compact format")


def _compact(body: str, schemas: dict[str, dict[str, Any]]) -> tuple[str, Any] | CallError:
    m = _COMPACT_CALL.fullmatch(body)
    if not m:
        return CallError("malformed", "a call must be NAME(ARGUMENTS)")
    name, inner = m.group(1), m.group(2)
    if name not in schemas:
        return name, {}
    props: dict[str, Any] = schemas[name]["function"].get("parameters", {}).get("properties", {})
    parts = [p.strip() for p in _split_top(inner)] if inner.strip() else []
    if len(parts) == 1 and len(props) == 1 and not re.fullmatch(_COMPACT_KEY + "=.*", parts[0], re.DOTALL):
        parts = [f"{next(iter(props))}={parts[0]}"]
    args: dict[str, Any] = {}
    for part in parts:
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep or key not in props:
            return CallError("bad_arguments", f"{part!r} is not KEY=VALUE with a parameter of {name} "
                                              f"({', '.join(props) or 'none'})", name)
        try:
            args[key] = _typed(props[key]["type"], raw.strip())
        except ValueError:
            return CallError("bad_arguments", f"argument {key!r} must be {props[key]['type']}, not {raw.strip()!r}",
                             name)
    return name, args


def compact_problems(schema: dict[str, Any]) -> list[str]:
    """What in a valid schema the compact format cannot call: a tool name or parameter name outside its characters,
    a parameter that is an array or an object."""
    fn = schema["function"]
    problems = [] if re.fullmatch(_COMPACT_NAME, fn["name"]) else [
        f"the compact format needs a tool name of lowercase letters, digits and '-' (not {fn['name']!r})"]
    for key, prop in fn.get("parameters", {}).get("properties", {}).items():
        if not re.fullmatch(_COMPACT_KEY, key):
            problems.append(f"the compact format needs parameter names of lowercase letters and digits (not {key!r})")
        elif prop["type"] not in _COMPACT_TYPES:
            problems.append(f"parameter {key!r} is {prop['type']}, which the compact format cannot write")
    return problems


def parse_calls(text: str, schemas: dict[str, dict[str, Any]], fmt: str, max_parallel_calls: int) -> Parsed:
    """The calls in one assistant turn, checked: known tool, arguments valid under its schema, at most
    ``max_parallel_calls`` (the first ones run, the rest are errors)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown tool-call format {fmt!r}; allowed: {', '.join(FORMATS)}")
    pattern = _HERMES if fmt == "hermes" else _COMPACT
    matches = _outside_fences(text, pattern)
    parsed = Parsed(content=text)
    for m in matches:
        got = _hermes(m.group(1)) if fmt == "hermes" else _compact(m.group(1), schemas)
        if isinstance(got, CallError):
            parsed.errors.append(got)
            continue
        name, args = got
        if name not in schemas:
            parsed.errors.append(CallError("unknown_tool", f"unknown tool {name!r}; available: "
                                                           f"{', '.join(sorted(schemas)) or 'none'}", name))
            continue
        problems = argument_problems(schemas[name], args)
        if problems:
            parsed.errors.append(CallError("bad_arguments", f"{name}: {'; '.join(problems)}", name))
        elif len(parsed.calls) >= max_parallel_calls:
            parsed.errors.append(CallError("too_many", f"more than max_parallel_calls = {max_parallel_calls} calls "
                                                       f"in one turn; {name} was not run", name))
        else:
            parsed.calls.append(ToolCall(name, args))
    for m in reversed(matches):
        parsed.content = parsed.content[:m.start()] + parsed.content[m.end():]
    return parsed
