"""Tool-call parsing (hermes and compact) against the tools' schemas, and the calculator's safe evaluator."""

from __future__ import annotations

import pytest

from hpcppo.agent.builtin import Calculator, CalcError, PythonRunner, evaluate
from hpcppo.agent.parse import FORMATS, ToolCall, compact_problems, parse_calls
from hpcppo.agent.schema import argument_problems, schema_problems
from hpcppo.config.multi_turn import TOOL_CALL_FORMATS

SCHEMAS = {"calculator": Calculator.default_schema, "python": PythonRunner.default_schema,
           "lookup": {"type": "function", "function": {"name": "lookup", "description": "d", "parameters": {
               "type": "object", "properties": {"n": {"type": "integer"}, "exact": {"type": "boolean"},
                                                "unit": {"type": "string", "enum": ["m", "s"]}},
               "required": ["n"]}}}}


def hermes(name: str, arguments: object) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_the_config_names_the_parsers_formats():
    assert TOOL_CALL_FORMATS == FORMATS


def test_hermes_call_is_parsed_and_removed_from_the_content():
    p = parse_calls("Let me compute. " + hermes("calculator", {"expression": "12*34"}) + " done", SCHEMAS,
                    "hermes", 1)
    assert p.calls == [ToolCall("calculator", {"expression": "12*34"})] and not p.errors
    assert p.content == "Let me compute.  done"


def test_hermes_arguments_as_a_json_string_are_accepted():
    p = parse_calls(hermes("lookup", '{"n": 3}'), SCHEMAS, "hermes", 1)
    assert p.calls == [ToolCall("lookup", {"n": 3})]


@pytest.mark.parametrize("body, kind, expect", [
    ('{"name": "calculator", "arguments": {"expression": "1"}', "malformed", "not valid JSON"),
    ("[1, 2]", "malformed", "must be an object"),
    ('{"arguments": {}}', "malformed", "must be an object with a \"name\""),
    ('{"name": "lookup", "arguments": "not json"}', "malformed", "not a JSON object"),
    ('{"name": "web_search", "arguments": {}}', "unknown_tool", "unknown tool 'web_search'; available: calculator"),
    ('{"name": "lookup", "arguments": {"n": "3"}}', "bad_arguments", "argument 'n' must be integer, not str"),
    ('{"name": "lookup", "arguments": {"n": true}}', "bad_arguments", "argument 'n' must be integer, not bool"),
    ('{"name": "lookup", "arguments": {}}', "bad_arguments", "missing required argument 'n'"),
    ('{"name": "lookup", "arguments": {"n": 1, "x": 2}}', "bad_arguments", "unknown argument 'x'"),
    ('{"name": "lookup", "arguments": {"n": 1, "unit": "kg"}}', "bad_arguments", "is not one of ['m', 's']"),
    ('{"name": "lookup", "arguments": [1]}', "bad_arguments", "arguments must be an object, not list"),
])
def test_bad_hermes_calls_are_errors_not_calls(body, kind, expect):
    p = parse_calls(f"x <tool_call>{body}</tool_call> y", SCHEMAS, "hermes", 4)
    assert p.calls == [] and len(p.errors) == 1
    assert p.errors[0].kind == kind and expect in p.errors[0].message, p.errors[0]
    assert p.content == "x  y"


def test_calls_inside_code_fences_are_text():
    fenced = "Example:\n```json\n" + hermes("calculator", {"expression": "1"}) + "\n```\nnow: "
    p = parse_calls(fenced + hermes("calculator", {"expression": "2"}), SCHEMAS, "hermes", 4)
    assert p.calls == [ToolCall("calculator", {"expression": "2"})]
    assert p.content == fenced  # the fenced one stays in the text
    unclosed = parse_calls("```\n" + hermes("calculator", {"expression": "1"}), SCHEMAS, "hermes", 4)
    assert unclosed.calls == [] and not unclosed.errors


def test_calls_beyond_max_parallel_calls_are_errors():
    text = "".join(hermes("calculator", {"expression": str(i)}) for i in range(3))
    p = parse_calls(text, SCHEMAS, "hermes", 2)
    assert [c.arguments["expression"] for c in p.calls] == ["0", "1"]
    assert [e.kind for e in p.errors] == ["too_many"] and "max_parallel_calls = 2" in p.errors[0].message
    # an invalid call does not use up a slot
    p = parse_calls(hermes("nope", {}) + hermes("calculator", {"expression": "1"}), SCHEMAS, "hermes", 1)
    assert len(p.calls) == 1 and [e.kind for e in p.errors] == ["unknown_tool"]


def test_compact_format():
    p = parse_calls("so <call>calculator((12+3)*4)</call> is", SCHEMAS, "compact", 2)
    assert p.calls == [ToolCall("calculator", {"expression": "(12+3)*4"})] and p.content == "so  is"
    p = parse_calls("<call>lookup(n=3, exact=true, unit=m)</call><call>lookup(n=x)</call>"
                    "<call>lookup(3)</call><call>web(1)</call><call>bad</call>", SCHEMAS, "compact", 4)
    assert p.calls == [ToolCall("lookup", {"n": 3, "exact": True, "unit": "m"})]
    kinds = [(e.kind, e.message) for e in p.errors]
    assert kinds[0] == ("bad_arguments", "argument 'n' must be integer, not 'x'")
    assert kinds[1][0] == "bad_arguments" and "'3' is not KEY=VALUE" in kinds[1][1]  # lookup has 3 parameters
    assert kinds[2][0] == "unknown_tool" and kinds[3][0] == "malformed"
    # the compact format needs only the tiny tokenizer's characters (and the two call tokens)
    from hpcppo.tiny.tokenizer import CHARS

    assert set("calculator((12+3)*4)") <= set(CHARS) and set("lookup(n=3, exact=true)") <= set(CHARS)
    assert compact_problems(Calculator.default_schema) == [] and compact_problems(PythonRunner.default_schema) == []


def test_schema_checks():
    assert schema_problems(Calculator.default_schema) == []
    assert schema_problems({"type": "function"}) == ["function must be a table with name, description and parameters"]
    bad = {"type": "function", "function": {"name": "1x", "description": 3, "parameters": {
        "type": "object", "properties": {"a": {"type": "str"}}, "required": ["b"]}}}
    problems = schema_problems(bad)
    assert any("function.name '1x'" in p for p in problems)
    assert any("description must be a string" in p for p in problems)
    assert any("properties.a.type must be one of string" in p for p in problems)
    assert any("required names ['b']" in p for p in problems)
    assert argument_problems(SCHEMAS["lookup"], {"n": 1.5}) == ["argument 'n' must be integer, not float"]


@pytest.mark.parametrize("expr, value", [("12*34", 408), ("(1+2)*-3", -9), ("2**10", 1024), ("7/2", 3.5),
                                         ("7//2", 3), ("-7%3", 2), ("+5", 5), (" 1.5 * 4 ", 6.0)])
def test_calculator_evaluates_arithmetic(expr, value):
    assert evaluate(expr) == value


@pytest.mark.parametrize("expr, expect", [
    ("__import__('os').system('true')", "not allowed: Call"), ("a + 1", "not allowed: Name"),
    ("'a' * 3", "not allowed: Constant"), ("True + 1", "not allowed: Constant"), ("(1).real", "not allowed: Attribute"),
    ("[1][0]", "not allowed: Subscript"), ("1 if 1 else 2", "not allowed: IfExp"), ("1 << 3", "not allowed: BinOp"),
    ("1/0", "division by zero"), ("2**100000", "exponent 100000 is too large"), ("9**9**9", "too large"),
    ("10**2000 * 10**2000", "result too large"), ("1e308 * 10", "not finite"), ("(-8) ** 0.5", "not a real number"),
    ("2.0 ** 5000", "too large"), ("1 +", "cannot parse"), ("1" * 600, "longer than 512"),
])
def test_calculator_refuses_everything_else(expr, expect):
    with pytest.raises(CalcError) as err:
        evaluate(expr)
    assert expect in str(err.value)


def test_calculator_tool_answers_errors_as_text():
    calc = Calculator({}, None)
    assert calc.execute("i", {"expression": "3*4"}) == ("12", 0.0, {"calc_error": 0.0})
    text, _, metrics = calc.execute("i", {"expression": "x"})
    assert text.startswith("error: not allowed") and metrics == {"calc_error": 1.0}
