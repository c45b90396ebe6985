"""Field helpers shared by every config section: one place for help text, ranges and choices.

Every config field is declared with :func:`opt`, which stores a one-line ``help`` and the allowed
values in the attrs metadata (``hpcppo config explain`` prints them) and attaches a validator whose
message we control. Validators raise :class:`FieldValueError`, which carries the field name so the
loader can report the full dotted key (``actor.clip_ratio_c``) together with the file it came from.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

__all__ = ["FieldValueError", "opt", "did_you_mean", "fmt_value", "SLURM_TIME_RE", "parse_slurm_time"]


class FieldValueError(ValueError):
    """A value is out of range or not allowed. ``field`` is the attribute name within its section."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest candidate, or ``""`` when nothing is close."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def fmt_value(value: Any) -> str:
    """A value as a user would write it in TOML (``true``, ``"abc"``, ``1e-06``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if value is None:
        return "(unset)"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {fmt_value(v)}" for k, v in value.items()) + "}"
    if attrs.has(type(value)):
        return type(value).__name__
    return repr(value)


# Slurm's --time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
SLURM_TIME_RE = re.compile(
    r"^(?:(?P<min>\d+)|(?P<m2>\d+):(?P<s2>\d+)|(?P<h3>\d+):(?P<m3>\d+):(?P<s3>\d+)"
    r"|(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?)$"
)


def parse_slurm_time(text: str) -> int:
    """Seconds in a Slurm time string (``"90"`` = 90 minutes, ``"1-12:00:00"``); ValueError if malformed."""
    m = SLURM_TIME_RE.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise ValueError(
            f"{text!r} is not a Slurm time (use minutes, MM:SS, HH:MM:SS or D-HH:MM:SS, e.g. \"04:00:00\")"
        )
    g = {k: int(v) if v is not None else 0 for k, v in m.groupdict().items()}
    if m.group("min") is not None:
        return g["min"] * 60
    if m.group("m2") is not None:
        return g["m2"] * 60 + g["s2"]
    if m.group("h3") is not None:
        return g["h3"] * 3600 + g["m3"] * 60 + g["s3"]
    return g["d"] * 86400 + g["dh"] * 3600 + g["dm"] * 60 + g["ds"]


def _range_text(ge: Any, gt: Any, le: Any, lt: Any) -> str:
    low = f">= {ge}" if ge is not None else (f"> {gt}" if gt is not None else "")
    high = f"<= {le}" if le is not None else (f"< {lt}" if lt is not None else "")
    if low and high:
        return f"{low} and {high}"
    return low or high


Choices = Sequence[Any] | Callable[[], Sequence[Any]]


def _choices_text(choices: Choices) -> str:
    return ", ".join(fmt_value(c) for c in (choices() if callable(choices) else choices))


def _make_validator(
    *,
    choices: Choices | None,
    ge: Any,
    gt: Any,
    le: Any,
    lt: Any,
    pattern: str | None,
    check: Callable[[Any], str | None] | None,
    each: bool,
) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    rx = re.compile(pattern) if pattern else None
    rng = _range_text(ge, gt, le, lt)

    def one(name: str, value: Any) -> None:
        if value is None:
            return
        current = choices() if callable(choices) else choices
        if current is not None and value not in current:
            allowed = ", ".join(fmt_value(c) for c in current)
            hint = did_you_mean(value, [str(c) for c in current]) if isinstance(value, str) else ""
            raise FieldValueError(name, f"{fmt_value(value)} is not allowed; allowed values: {allowed}{hint}")
        bad = (
            (ge is not None and not value >= ge)
            or (gt is not None and not value > gt)
            or (le is not None and not value <= le)
            or (lt is not None and not value < lt)
        )
        if bad:
            raise FieldValueError(name, f"{fmt_value(value)} is out of range; must be {rng}")
        if rx is not None and not rx.fullmatch(value):
            raise FieldValueError(name, f"{fmt_value(value)} does not match {pattern}")
        if check is not None:
            problem = check(value)
            if problem:
                raise FieldValueError(name, problem)

    def validate(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if each and isinstance(value, (list, tuple)):
            for item in value:
                one(attribute.name, item)
        else:
            one(attribute.name, value)

    return validate


def opt(
    default: Any = attrs.NOTHING,
    *,
    help: str,
    factory: Callable[[], Any] | None = None,
    choices: Choices | None = None,
    ge: Any = None,
    gt: Any = None,
    le: Any = None,
    lt: Any = None,
    pattern: str | None = None,
    check: Callable[[Any], str | None] | None = None,
    allowed: str = "",
    each: bool = False,
    path: bool = False,
) -> Any:
    """Declare a config field.

    ``help`` is the one-line description; ``choices``/``ge``/``gt``/``le``/``lt``/``pattern`` become
    the validator and the "allowed" line of ``explain`` (``allowed`` overrides that text); ``choices`` may be a
    function returning them, asked at each validation (names a registry declares at run time); ``check``
    returns an error message or None; ``each`` applies the checks to every element of a list;
    ``path=True`` marks file-system paths that are made absolute against the spec's directory.
    """
    text: str | Callable[[], str] = allowed
    if not text:
        if callable(choices):
            text = functools.partial(_choices_text, choices)  # the registry's names when explain asks
        elif choices is not None:
            text = _choices_text(choices)
        else:
            text = _range_text(ge, gt, le, lt)
            if pattern and not text:
                text = f"matches {pattern}"
    metadata = {"help": help, "allowed": text, "path": path,
                "choices": choices if callable(choices) or not choices else tuple(choices)}
    needs_validator = any(x is not None for x in (choices, ge, gt, le, lt, pattern, check))
    validator = (
        _make_validator(choices=choices, ge=ge, gt=gt, le=le, lt=lt, pattern=pattern, check=check, each=each)
        if needs_validator
        else None
    )
    if factory is not None:
        return attrs.field(factory=factory, metadata=metadata, validator=validator)
    return attrs.field(default=default, metadata=metadata, validator=validator)
