"""Strict TOML -> attrs structuring, and translation of every failure into one ``ConfigError`` line.

cattrs' default hooks coerce (``int("5")``, ``bool("false") is True``, a string iterated as a list);
here every primitive is checked for its TOML type instead. A failure anywhere in a nested structure is
reduced to its first leaf with the full dotted key (``watchdog.rules[1].action``).
"""

from __future__ import annotations

import math
import os
import re
import stat
import tomllib
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import cattrs
from cattrs.errors import (AttributeValidationNote, ClassValidationError, ForbiddenExtraKeysError,
                           IterableValidationError, IterableValidationNote)

from hpcppo.config.fields import FieldValueError, did_you_mean, fmt_value
from hpcppo.errors import ConfigError

__all__ = ["converter", "read_toml", "read_input", "MAX_INPUT_BYTES", "structure", "type_text", "toml_type_name", "first_error",
           "section_fields", "is_section"]


def toml_type_name(value: Any) -> str:
    """The TOML name of a Python value's type (as a user sees it in the file)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "table"
    return type(value).__name__


def type_text(tp: Any) -> str:
    """A type as the docs say it: ``integer``, ``array of string``, ``float or unset``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is int:
        return "integer"
    if tp is float:
        return "float"
    if tp is bool:
        return "boolean"
    if tp is str:
        return "string"
    if tp is Any:
        return "any"
    if origin is list:
        return f"array of {type_text(args[0])}"
    if origin is dict:
        return f"table of {type_text(args[1])}"
    if origin in (typing.Union, getattr(__import__('types'), 'UnionType', None)):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(type_text(a) for a in inner) + " or unset"
    if attrs.has(tp):
        return "table"
    return str(tp)


class _Located(ValueError):
    """An error at ``[index]`` or ``.key`` inside a list or dict (our strict container hooks)."""

    def __init__(self, part: str, cause: BaseException):
        super().__init__(str(cause))
        self.part = part
        self.cause = cause


def _expected(what: str, value: Any) -> TypeError:
    kind = toml_type_name(value)
    article = "an" if kind[0] in "aeiou" else "a"
    return TypeError(f"expected {what}, got {fmt_value(value)} ({article} {kind})")


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)

    def s_int(v: Any, _: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise _expected("an integer", v)
        if not -(2**63) <= v < 2**63:  # TOML's integers are 64-bit; every count and id here is one
            raise ValueError(f"{fmt_value(v)} is past a 64-bit integer; allowed: -2**63 to 2**63 - 1")
        return v

    def s_float(v: Any, _: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _expected("a float", v)
        if not math.isfinite(v):  # no config number means anything as nan or +-inf (TOML allows them)
            raise ValueError(f"{fmt_value(float(v))} is not allowed; a finite number is expected")
        return float(v)

    def s_bool(v: Any, _: Any) -> bool:
        if not isinstance(v, bool):
            raise _expected("a boolean (true or false)", v)
        return v

    def s_str(v: Any, _: Any) -> str:
        if not isinstance(v, str):
            raise _expected("a string", v)
        return v

    def s_any(v: Any, _: Any) -> Any:
        return v

    conv.register_structure_hook(int, s_int)
    conv.register_structure_hook(float, s_float)
    conv.register_structure_hook(bool, s_bool)
    conv.register_structure_hook(str, s_str)
    conv.register_structure_hook(Any, s_any)

    def s_str_or_number(v: Any, _: Any) -> str | float | None:
        # verl's ``str | float`` thresholds (algorithm.rollout_correction.rollout_rs_threshold)
        if isinstance(v, bool) or not (v is None or isinstance(v, (str, int, float))):
            raise _expected("a string or a number", v)
        return v if v is None or isinstance(v, str) else s_float(v, None)

    conv.register_structure_hook(str | float | None, s_str_or_number)

    def list_factory(tp: Any) -> Callable[[Any, Any], list[Any]]:
        (item_type,) = typing.get_args(tp) or (Any,)

        def s_list(v: Any, _: Any) -> list[Any]:
            if not isinstance(v, list):
                raise _expected(f"an array of {type_text(item_type)}", v)
            out = []
            for i, item in enumerate(v):
                try:
                    out.append(conv.structure(item, item_type))
                except Exception as exc:  # noqa: BLE001 - re-raised with its index
                    raise _Located(f"[{i}]", exc) from exc
            return out

        return s_list

    def dict_factory(tp: Any) -> Callable[[Any, Any], dict[Any, Any]]:
        args = typing.get_args(tp)
        value_type = args[1] if len(args) == 2 else Any

        def s_dict(v: Any, _: Any) -> dict[Any, Any]:
            if not isinstance(v, dict):
                raise _expected(f"a table of {type_text(value_type)}", v)
            out = {}
            for k, item in v.items():
                try:
                    out[k] = conv.structure(item, value_type)
                except Exception as exc:  # noqa: BLE001 - re-raised with its key
                    raise _Located(str(k), exc) from exc
            return out

        return s_dict

    conv.register_structure_hook_factory(lambda t: _origin(t) is list, list_factory)
    conv.register_structure_hook_factory(lambda t: _origin(t) is dict, dict_factory)
    return conv


def _origin(tp: Any) -> Any:
    """``typing.get_origin``, typed as what it is here: the class of a generic alias (``list[int]`` -> ``list``)."""
    return typing.get_origin(tp)


converter = _make_converter()


def is_section(attribute: attrs.Attribute[Any]) -> bool:
    """True for fields whose value is a nested section (an attrs class)."""
    return isinstance(attribute.type, type) and attrs.has(attribute.type)


def section_class(attribute: attrs.Attribute[Any]) -> type:
    """The class of a field for which :func:`is_section` holds."""
    if not isinstance(attribute.type, type):
        raise TypeError(f"{attribute.name} is not a section")
    return attribute.type


def section_fields(cls: type) -> dict[str, attrs.Attribute[Any]]:
    """The fields of a section class by name, with their types resolved."""
    attrs.resolve_types(cls)
    return {a.name: a for a in attrs.fields(cls)}


def _join(path: str, part: str) -> str:
    if part.startswith("["):
        return path + part
    return f"{path}.{part}" if path else part


def first_error(exc: BaseException, path: str = "", cls: type | None = None) -> tuple[str, str]:
    """Reduce a (nested) structuring failure to ``(dotted_key, message)`` of its first leaf."""
    if isinstance(exc, ForbiddenExtraKeysError):
        key = sorted(exc.extra_fields)[0]
        known = list(section_fields(exc.cl)) if attrs.has(exc.cl) else []
        hint = did_you_mean(key, known)
        return _join(path, key), f"unknown key{hint}; known keys here: {', '.join(known)}"
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        sub_cls = getattr(exc, "cl", cls)
        for sub in exc.exceptions:
            sub_path = path
            for note in getattr(sub, "__notes__", []):
                if isinstance(note, AttributeValidationNote):
                    sub_path = _join(path, note.name)
                elif isinstance(note, IterableValidationNote):
                    sub_path = _join(path, f"[{note.index}]")
            return first_error(sub, sub_path, sub_cls)
        return path, str(exc)
    if isinstance(exc, _Located):
        return first_error(exc.cause, _join(path, exc.part), cls)
    if isinstance(exc, FieldValueError):
        return _join(path, exc.field), exc.message
    if isinstance(exc, KeyError):
        return path, "required key is missing"
    return path, str(exc)


def structure(data: Any, tp: Any, *, file: str | None, path: str = "",
              file_for: Callable[[str], str | None] | None = None) -> Any:
    """Structure ``data`` into ``tp`` strictly; any failure becomes one ``ConfigError``.

    ``path`` prefixes the reported key; ``file_for(key)`` may name the file a key came from (for
    merged layers), falling back to ``file``.
    """
    try:
        return converter.structure(data, tp)
    except Exception as exc:  # noqa: BLE001 - every structuring failure is a user error here
        key, message = first_error(exc, path, tp if attrs.has(tp) else None)
        where = (file_for(key) if file_for else None) or file
        raise ConfigError(message, file=where, key=key or None) from None


_TOML_POS = re.compile(r"^(?P<msg>.*?)\s*\(at (?:line (?P<line>\d+), column (?P<col>\d+)|end of document)\)$")


MAX_INPUT_BYTES = 1 << 20  # a hand-written spec, site or verl script is a few KiB; 1 MiB bounds time and memory


def read_input(path: str | Path, *, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ``ConfigError`` naming the file for anything else
    (a FIFO, a device such as /dev/zero, a directory, a file too large), so that no input hangs or fills memory.
    ``FileNotFoundError`` and other ``OSError`` pass through for the caller's message."""
    # O_NONBLOCK: opening a FIFO without a writer would otherwise wait forever before fstat can refuse it.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                    else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "a socket"
                    if stat.S_ISSOCK(info.st_mode) else "not a regular file")
            raise ConfigError(f"is {kind}; allowed: a regular file of at most {limit // 1024} KiB", file=str(path))
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise ConfigError(f"is larger than {limit // 1024} KiB; allowed: a regular file of at most "
                          f"{limit // 1024} KiB", file=str(path))
    return b"".join(chunks)


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a TOML file (a regular file of at most :data:`MAX_INPUT_BYTES`); errors name the file, line and
    column."""
    p = Path(path)
    try:
        data = read_input(p)
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(p)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=str(p)) from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except RecursionError:
        raise ConfigError("arrays or inline tables nested too deeply to read; a spec nests a few levels",
                          file=str(p)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); a TOML file must be "
                          f"UTF-8 text", file=str(p)) from None
    except tomllib.TOMLDecodeError as exc:
        m = _TOML_POS.match(str(exc))
        if m and m.group("line"):
            msg = f"line {m.group('line')}, column {m.group('col')}: {m.group('msg')}"
        elif m:
            msg = f"at end of file: {m.group('msg')}"
        else:
            msg = str(exc)
        raise ConfigError(msg, file=str(p)) from None
