"""The built-in tools: ``Calculator`` (a safe arithmetic evaluator: ``ast``, never ``eval``), ``PythonRunner``
(code run through :mod:`hpcppo.agent.sandbox`) and ``Gsm8kAnswer`` (verl's GSM8K answer checker, what
``import-verl`` makes of ``verl.tools.gsm8k_tool.Gsm8kTool``). Their import paths are
``hpcppo.agent.builtin.<Class>``."""

from __future__ import annotations

import ast
import math
import operator
import re
import sys
from collections.abc import Callable
from typing import Any, ClassVar

from hpcppo.agent.sandbox import SandboxLimits, isolation, run_sandboxed
from hpcppo.agent.tool import Tool

__all__ = ["Calculator", "PythonRunner", "Gsm8kAnswer", "evaluate", "CalcError", "gsm8k_flexible_score"]

MAX_EXPRESSION_CHARS = 512
MAX_INT_BITS = 4096  # about 1,233 decimal digits
MAX_EXPONENT = 10_000

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalcError(ValueError):
    """The expression is not allowed or cannot be computed; the message is the tool's answer."""


def _bits(x: int | float) -> int:
    return x.bit_length() if isinstance(x, int) else 0


def _check_size(op: type, a: int | float, b: int | float) -> None:
    if op is ast.Pow:
        if abs(b) > MAX_EXPONENT:
            raise CalcError(f"exponent {b} is too large (at most {MAX_EXPONENT})")
        if isinstance(a, int) and isinstance(b, int) and b > 0 and _bits(a) * b > MAX_INT_BITS:
            raise CalcError(f"result too large (more than {MAX_INT_BITS} bits)")
    elif op is ast.Mult and _bits(a) + _bits(b) > MAX_INT_BITS:
        raise CalcError(f"result too large (more than {MAX_INT_BITS} bits)")


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value  # type: ignore[return-value]  # the check above: an int or a float
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        result: int | float = _UNARY[type(node.op)](_eval(node.operand))
        return result
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        a, b = _eval(node.left), _eval(node.right)
        _check_size(type(node.op), a, b)
        try:
            value = _BINARY[type(node.op)](a, b)
        except ZeroDivisionError:
            raise CalcError("division by zero") from None
        except OverflowError:
            raise CalcError("result too large") from None
        if not isinstance(value, (int, float)):  # a negative number to a fractional power: complex
            raise CalcError("result is not a real number")
        return value
    raise CalcError(f"not allowed: {type(node).__name__}; only numbers, + - * / // % **, unary minus and parentheses")


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; CalcError for anything else (names, calls, attributes, strings ...)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise CalcError(f"cannot parse the expression: {exc.msg if isinstance(exc, SyntaxError) else exc}") from None
    value = _eval(tree)
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError("result is not finite")
    return value


def _fmt(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


class Calculator(Tool):
    """Evaluates one arithmetic expression. Step reward 0; metric ``calc_error`` (0/1)."""

    default_schema: ClassVar[dict[str, Any] | None] = {
        "type": "function",
        "function": {"name": "calculator", "description": "Evaluate an arithmetic expression: numbers, + - * / // % "
                                                         "**, parentheses.",
                     "parameters": {"type": "object", "properties": {"expression": {
                         "type": "string", "description": "e.g. (12 + 3) * 45"}}, "required": ["expression"]}}}

    def execute(self, instance_id: str, parameters: dict[str, Any],
                **execute_kwargs: Any) -> tuple[str, float, dict[str, float]]:
        try:
            return _fmt(evaluate(str(parameters.get("expression", "")))), 0.0, {"calc_error": 0.0}
        except CalcError as exc:
            return f"error: {exc}", 0.0, {"calc_error": 1.0}


class PythonRunner(Tool):
    """Runs a Python program in the sandbox; the observation is its stdout (and stderr's last lines on a failure).

    config: ``python`` (the interpreter; "" = this one, or /usr/bin/python3 when the sandbox runs as another user,
    which cannot run an interpreter under /root), and the limits ``wall_s``, ``cpu_s``, ``memory_mb``,
    ``max_processes``, ``max_output_bytes``, ``user``. Metrics: ``sandbox/<status>`` = 1 for the call's status.
    """

    default_schema: ClassVar[dict[str, Any] | None] = {
        "type": "function",
        "function": {"name": "python", "description": "Run a Python program and return what it prints.",
                     "parameters": {"type": "object", "properties": {"code": {
                         "type": "string", "description": "The program."}}, "required": ["code"]}}}
    #: config key -> (type, lowest value) of the limits; ``python`` and ``user`` are strings.
    LIMITS: ClassVar[dict[str, tuple[type, float]]] = {
        "wall_s": (float, 0.1), "cpu_s": (int, 1), "memory_mb": (int, 32), "max_processes": (int, 2),
        "max_output_bytes": (int, 1)}

    @classmethod
    def config_problems(cls, config: dict[str, Any]) -> list[str]:
        problems = []
        for key, value in config.items():
            if key in ("python", "user"):
                if not isinstance(value, str):
                    problems.append(f"config.{key} must be a string")
            elif key in cls.LIMITS:
                kind, low = cls.LIMITS[key]
                if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
                    problems.append(f"config.{key} must be {'a number' if kind is float else 'an integer'}")
                elif value < low:
                    problems.append(f"config.{key} = {value} must be >= {low:g}")
            else:
                problems.append(f"unknown config key {key!r}; allowed: python, user, {', '.join(cls.LIMITS)}")
        return problems

    def __init__(self, config: dict[str, Any], tool_schema: dict[str, Any] | None):
        super().__init__(config, tool_schema)
        problems = self.config_problems(self.config)
        if problems:
            raise ValueError("; ".join(problems))
        c = self.config
        self.limits = SandboxLimits(wall_s=float(c.get("wall_s", 10.0)), cpu_s=int(c.get("cpu_s", 5)),
                                    memory_bytes=int(c.get("memory_mb", 512)) * 2**20,
                                    max_processes=int(c.get("max_processes", 16)),
                                    max_output_bytes=int(c.get("max_output_bytes", 16384)),
                                    user=str(c.get("user", "nobody")))
        self.python = str(c.get("python", "")) or ("/usr/bin/python3" if isolation().as_root else sys.executable)

    def execute(self, instance_id: str, parameters: dict[str, Any],
                **execute_kwargs: Any) -> tuple[str, float, dict[str, float]]:
        result = run_sandboxed([self.python, "-I", "main.py"], self.limits,
                               files={"main.py": str(parameters.get("code", ""))})
        metrics = {f"sandbox/{result.status}": 1.0, "sandbox/wall_s": result.wall_s}
        if result.ok:
            return result.stdout, 0.0, metrics
        tail = "\n".join(result.stderr.strip().splitlines()[-3:])
        text = f"error: {result.status} ({result.detail})" + (f"\n{tail}" if tail else "")
        return (result.stdout + "\n" + text if result.stdout else text), 0.0, metrics


#: verl's gsm8k scorer reads only the last characters of a solution (verl/utils/reward_score/gsm8k.py at b178a3c).
GSM8K_TAIL_CHARS = 300
_NUMBER_LIKE = re.compile(r"-?[0-9.,]+")


def gsm8k_flexible_score(solution: str, ground_truth: Any) -> float:
    """verl's ``gsm8k.compute_score(solution, ground_truth, method="flexible", format_score=0.0, score=1.0)``: the
    last run of digits, dots and commas (not "" or ".") in the last 300 characters, compared as text with the ground
    truth: 1.0 when equal, else 0.0 (commas are kept, as verl keeps them in this method)."""
    candidates = [c for c in _NUMBER_LIKE.findall(solution[-GSM8K_TAIL_CHARS:]) if c not in ("", ".")]
    return 1.0 if candidates and candidates[-1] == ground_truth else 0.0


class Gsm8kAnswer(Tool):
    """verl's ``Gsm8kTool`` (verl/tools/gsm8k_tool.py at b178a3c), synchronous: the model submits its answer
    (``calc_gsm8k_reward(answer)``) and hears back whether it is right.

    ``create(ground_truth=...)`` (or verl's ``create_kwargs={"ground_truth": ...}``, as a row's
    ``extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs`` gives it) holds the row's answer. ``execute`` scores
    ``"#### " + answer`` with :func:`gsm8k_flexible_score`; its step reward is 0.0 when the score rose above the
    trajectory's best so far, else -0.05 (verl's penalty for an answer that does not improve); the observation is
    ``Current parsed answer='...' reward=...``. ``calc_reward`` is the score of the last answer submitted.
    """

    default_schema: ClassVar[dict[str, Any] | None] = {
        "type": "function",
        "function": {"name": "calc_gsm8k_reward",
                     "description": "Check an answer to the GSM8K problem: 1.0 if it is correct, else 0.0.",
                     "parameters": {"type": "object", "properties": {"answer": {
                         "type": "string", "description": "The answer, digits only."}}, "required": ["answer"]}}}
    NO_IMPROVEMENT_PENALTY = -0.05

    def create(self, instance_id: str | None = None, **create_kwargs: Any) -> str:
        instance_id = super().create(instance_id)
        truth = create_kwargs.get("ground_truth", (create_kwargs.get("create_kwargs") or {}).get("ground_truth"))
        self._instances[instance_id] = {"response": "", "ground_truth": truth, "reward": 0.0}
        return instance_id

    def execute(self, instance_id: str, parameters: dict[str, Any],
                **execute_kwargs: Any) -> tuple[str, float, dict[str, float]]:
        state = self._instances[instance_id]
        answer = str(parameters.get("answer", ""))
        state["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else self.NO_IMPROVEMENT_PENALTY
        state["reward"] = reward
        return f"Current parsed answer={answer!r} reward={reward!r}", step_reward, {"gsm8k/correct": reward}

    def calc_reward(self, instance_id: str, **calc_reward_kwargs: Any) -> float:
        state = self._instances[instance_id]
        return gsm8k_flexible_score(state["response"], state["ground_truth"])
