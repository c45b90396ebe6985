"""verl's configuration keys in hpcppo terms: the one table that ``hpcppo import-verl``, ``-o``, ``config explain``,
did-you-mean and ``docs/verl.md`` all read.

Each :class:`Entry` names a dotted verl key (as ``python3 -m verl.trainer.main_ppo key=value`` takes it) and what
it becomes here:

``map``          an hpcppo key, with a value translation where the conventions differ (``save_freq = 0``);
``not-verl``     a key verl does not have but people type (``actor.use_dual_clip``): the note names the real key;
``ignored``      accepted and not applied because the result is the same here (logging, speed knobs, FSDP1-only
                 options under FSDP2, Ray);
``unsupported``  a setting hpcppo cannot honour; values in ``ok`` are what hpcppo does anyway and pass.

The table is in :mod:`hpcppo.verl.names.table`, the entry type and the value translations in
:mod:`hpcppo.verl.names.convert`; this module answers questions about it (lookup, hints, ``-o`` overrides,
``config explain``, the rows of docs/verl.md) and re-exports what callers use.

Read against verl at commit b178a3cd (2026-01-29): ``verl/trainer/config/_generated_ppo_trainer.yaml`` (the composed
``ppo_trainer.yaml``), ``verl/workers/fsdp_workers.py`` and ``verl/trainer/ppo/ray_trainer.py`` for what the keys
do. No torch here: the login-node commands import this module.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from hpcppo.verl.names.convert import (A, IGNORED, MAP, NOT_VERL, R, REWARD_KWARGS, UNSUPPORTED, VERL_COMMIT, Entry,
                                        Ignored, Untranslatable, VerlNameWarning, show_value, run_name, whole_number)
from hpcppo.verl.names.table import ENTRIES, ign

__all__ = ["Entry", "ENTRIES", "Untranslatable", "Ignored", "lookup", "hint", "parse_value", "translate_override",
           "verl_names_for", "describe", "MAP", "NOT_VERL", "IGNORED", "UNSUPPORTED", "VERL_COMMIT", "VerlNameWarning",
           "whole_number", "run_name", "REWARD_KWARGS", "A", "R", "table_rows"]

_EXACT: dict[str, Entry] = {}
for _e in ENTRIES:
    if _e.verl in _EXACT:
        raise RuntimeError(f"verl key {_e.verl} is in the table twice")
    _EXACT[_e.verl] = _e
_PREFIXES = sorted((e for e in ENTRIES if e.prefix), key=lambda e: -len(e.verl))


def lookup(key: str) -> Entry | None:
    """The entry of a verl dotted key (a ``+``/``++`` prefix is dropped): exact, else the longest prefix entry."""
    key = key.lstrip("+")
    if key in _EXACT:
        return _EXACT[key]
    if key.endswith("._target_"):
        return ign(key, "Hydra's class to build; not a setting")
    return next((e for e in _PREFIXES if key.startswith(e.verl + ".")), None)


def _suffix_matches(key: str) -> list[Entry]:
    """Entries whose verl key ends with ``key`` at a dot (``actor.optim.lr``, ``rollout.name``): partial verl names."""
    if key.count(".") < 1:
        return []
    return [e for e in ENTRIES if not e.prefix and e.kind in (MAP, NOT_VERL) and e.verl.endswith("." + key)]


def _target_text(e: Entry) -> str:
    if e.kind in (MAP, NOT_VERL):
        return f"in hpcppo this is `{e.hpcppo}`"
    if e.kind == IGNORED:
        return f"hpcppo has no such setting and needs none: {e.note}"
    return f"hpcppo does not support it: {e.note}"


def hint(key: str) -> str | None:
    """The pointer for a key typed in verl's words (``trainer.save_freq`` -> ``checkpoint.save_every``), or None.

    Used before edit-distance suggestions: the mapping knows what the user meant."""
    e = lookup(key) if not key.startswith("+") else None
    if e is not None:
        who = "not a verl key either" if e.kind == NOT_VERL else "verl's name"
        extra = f" ({e.note})" if e.kind == NOT_VERL or (e.context and e.note) else ""
        return f"{key} is {who}; {_target_text(e)}{extra}"
    matches = _suffix_matches(key)
    targets = sorted({e.hpcppo for e in matches})
    if len(targets) == 1 and all(e.kind == NOT_VERL for e in matches):
        return f"{key} is not a verl key either; in hpcppo this is `{targets[0]}` ({matches[0].note})"
    if len(targets) == 1:
        verl_keys = ", ".join(e.verl for e in matches if e.hpcppo == targets[0])
        return f"{key} looks like verl's {verl_keys}; in hpcppo this is `{targets[0]}`"
    if len(targets) > 1:
        return f"{key} looks like a verl key; in hpcppo it is one of " + ", ".join(f"`{t}`" for t in targets)
    return None


_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?|[+-]?(inf|nan)", re.IGNORECASE)


def _scalar(text: str) -> Any:
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    low = t.lower()
    if low in ("null", "none", "~"):
        return None
    if low in ("true", "false"):
        return low == "true"
    if _INT.fullmatch(t):
        return int(t)
    if _FLOAT.fullmatch(t):
        return float(t)
    return t


def _split_top(text: str) -> list[str]:
    parts, depth, quote, cur = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def parse_value(text: str) -> Any:
    """A value as Hydra's override grammar reads it: ``1e-6``, ``True``, ``null``, ``'error'``, ``[a,'b']``, ``{}``."""
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        return [parse_value(p) for p in _split_top(t[1:-1])]
    if t.startswith("{") and t.endswith("}"):
        out = {}
        for p in _split_top(t[1:-1]):
            k, _, v = p.partition(":")
            out[str(_scalar(k))] = parse_value(v)
        return out
    return _scalar(t)


def translate(entry: Entry, value: Any, ctx: Mapping[str, Any]) -> Any:
    """The hpcppo value of a ``map`` entry; raises :class:`Untranslatable` or :class:`Ignored`."""
    return entry.convert(value, ctx) if entry.convert else value


def translate_override(key: str, raw: str) -> tuple[str, Any, str] | None:
    """``-o`` with a verl key: ``(hpcppo key, value, warning)`` when it translates on its own, else None."""
    e = lookup(key)
    if e is None or e.kind != MAP or e.context:
        return None
    try:
        value = translate(e, parse_value(raw), {})
    except (Untranslatable, Ignored):
        return None
    shown = "[" + ", ".join(map(repr, value)) + "]" if isinstance(value, list) else repr(value)
    return e.hpcppo, value, f"-o {key}={raw} is verl's name; in hpcppo this is {e.hpcppo}: applied as {e.hpcppo} = {shown}"


def verl_names_for(hpcppo_key: str) -> list[str]:
    """The verl keys that map to an hpcppo key (``actor.clip_ratio`` -> ``actor_rollout_ref.actor.clip_ratio``)."""
    return [e.verl for e in ENTRIES if e.kind == MAP and e.hpcppo == hpcppo_key]


def describe(key: str) -> str | None:
    """``config explain`` for a verl key: the pointer, or None when the table does not know the key."""
    text = hint(key)
    if text is None:
        return None
    e = lookup(key)
    if e is not None and e.kind == MAP and e.note:
        text += f" ({e.note})"
    if e is not None and e.kind == UNSUPPORTED and e.ok:
        text += "; accepted values: " + ", ".join(show_value(v) for v in e.ok)
    return text


def table_rows(entries: Iterable[Entry] = ENTRIES) -> list[tuple[str, str, str]]:
    """``(verl key, hpcppo, note)`` rows of the mapping, for docs/verl.md and ``import-verl --table``."""
    rows = []
    for e in entries:
        verl = f"`{e.verl}{'.*' if e.prefix else ''}`"
        if e.kind == MAP:
            target = f"`{e.hpcppo}`"
        elif e.kind == NOT_VERL:
            target = f"not a verl key: `{e.hpcppo}`"
        elif e.kind == IGNORED:
            target = "ignored"
        else:
            target = "not supported" + (f" (accepted: {', '.join(f'`{show_value(v)}`' for v in e.ok)})" if e.ok else "")
        rows.append((verl, target, e.note))
    return rows
