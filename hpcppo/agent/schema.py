"""OpenAI function schemas (verl's ``OpenAIFunctionToolSchema`` in verl/tools/schemas.py): checking a tool's schema,
and checking a call's arguments against it. No pydantic, no jsonschema: the subset verl's schema class models.

A tool schema is ``{"type": "function", "function": {"name", "description", "parameters": {"type": "object",
"properties": {NAME: {"type", "description"?, "enum"?}}, "required": [NAME, ...]}}}``.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["schema_problems", "argument_problems", "tool_name", "PARAM_TYPES"]

#: JSON-schema types a parameter may have, and the Python types a value of each may be.
PARAM_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                            "boolean": (bool,), "array": (list,), "object": (dict,)}
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


def tool_name(schema: dict[str, Any]) -> str:
    return str(schema["function"]["name"])


def schema_problems(schema: Any) -> list[str]:
    """What is wrong with a tool schema, one short phrase each (empty: valid)."""
    if not isinstance(schema, dict):
        return [f"the schema must be a table, not {type(schema).__name__}"]
    if schema.get("type") != "function":
        return [f"type must be \"function\", not {schema.get('type')!r}"]
    fn = schema.get("function")
    if not isinstance(fn, dict):
        return ["function must be a table with name, description and parameters"]
    problems = []
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        problems.append(f"function.name {name!r} must be 1-64 letters, digits, '_' or '-', starting with a letter")
    if not isinstance(fn.get("description"), str):
        problems.append("function.description must be a string")
    unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
    if unknown:
        problems.append(f"function has unknown keys {unknown}; allowed: name, description, parameters, strict")
    params = fn.get("parameters", {"type": "object", "properties": {}, "required": []})
    return problems + _parameter_problems(params)


def _parameter_problems(params: Any) -> list[str]:
    if not isinstance(params, dict) or params.get("type") != "object":
        return ["function.parameters must be a table with type = \"object\""]
    props = params.get("properties", {})
    if not isinstance(props, dict):
        return ["function.parameters.properties must be a table"]
    problems = []
    for key, prop in props.items():
        where = f"function.parameters.properties.{key}"
        if not isinstance(prop, dict) or prop.get("type") not in PARAM_TYPES:
            problems.append(f"{where}.type must be one of {', '.join(PARAM_TYPES)}")
            continue
        enum = prop.get("enum")
        if enum is not None and not (isinstance(enum, list) and enum):
            problems.append(f"{where}.enum must be a non-empty list")
    required = params.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        problems.append("function.parameters.required must be a list of names")
    else:
        missing = [r for r in required if r not in props]
        if missing:
            problems.append(f"function.parameters.required names {missing}, which are not in properties")
    return problems


def argument_problems(schema: dict[str, Any], arguments: Any) -> list[str]:
    """What is wrong with a call's arguments under a valid schema: not an object, a required one missing, an
    unknown one, a value of the wrong type or outside its enum."""
    if not isinstance(arguments, dict):
        return [f"arguments must be an object, not {type(arguments).__name__}"]
    params = schema["function"].get("parameters", {})
    props: dict[str, Any] = params.get("properties", {})
    problems = [f"missing required argument {r!r}" for r in params.get("required", []) if r not in arguments]
    for key, value in arguments.items():
        prop = props.get(key)
        if prop is None:
            problems.append(f"unknown argument {key!r}; allowed: {', '.join(props) or 'none'}")
            continue
        kind = prop["type"]
        # bool is an int in Python: true is not an integer here.
        if not isinstance(value, PARAM_TYPES[kind]) or (kind in ("integer", "number") and isinstance(value, bool)):
            problems.append(f"argument {key!r} must be {kind}, not {type(value).__name__}")
        elif prop.get("enum") is not None and value not in prop["enum"]:
            problems.append(f"argument {key!r} = {value!r} is not one of {prop['enum']}")
    return problems
