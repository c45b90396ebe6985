"""Errors name real keys: every dotted config key that an error in hpcppo's source names (in its message, its
hint, or its ``key=``) exists in the schema, as ``hpcppo config explain`` knows it.

The keys are found in the source, not in a list kept by hand: every call of a class whose name ends in ``Error``
(``ConfigError``, ``ResolveError``, ``FieldValueError``, ``ValueError`` ...) is read with ``ast``; its string
constants (f-string parts included) are searched for ``<section>.<key>`` where ``<section>`` is a section of the
experiment, ``site.`` or ``plan.``; and a dotted ``key=`` argument (``ConfigError``'s) counts whatever its first part,
a name being resolved to the module's string constant of that name.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import attrs
import pytest

from hpcppo.config import RunPlan, Site, explain
from hpcppo.config.convert import is_section
from hpcppo.config.experiment import Experiment
from hpcppo.errors import ConfigError

SRC = Path(__file__).resolve().parents[2] / "hpcppo"
_SECTIONS = sorted(f.name for f in attrs.fields(Experiment) if is_section(f)) + ["site", "plan"]
_KEY_RE = re.compile(r"(?<![\w./-])((?:%s)(?:\.[a-z_][a-z0-9_]*)+)" % "|".join(_SECTIONS))


def _string_constants(module: ast.Module) -> dict[str, str]:
    out = {}
    for node in module.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
    return out


def _callee(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def keys_in_source(source: str, label: str, found: dict[str, list[str]]) -> dict[str, list[str]]:
    """Add ``{dotted key: ["label:line", ...]}`` for every key an error constructor in ``source`` names."""
    module = ast.parse(source, label)
    constants = _string_constants(module)
    for call in ast.walk(module):
        if not (isinstance(call, ast.Call) and _callee(call).endswith("Error")):
            continue
        keys = [k for n in ast.walk(call) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                for k in _KEY_RE.findall(n.value)]
        for kw in call.keywords:
            value = kw.value.value if isinstance(kw.value, ast.Constant) else (
                constants.get(kw.value.id) if isinstance(kw.value, ast.Name) else None)
            if kw.arg == "key" and isinstance(value, str) and "." in value:
                keys.append(value)
        for key in keys:
            found.setdefault(key, []).append(f"{label}:{call.lineno}")
    return found


def keys_named_in_errors() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        keys_in_source(path.read_text(), str(path.relative_to(SRC.parent)), found)
    return found


def test_the_scan_finds_the_keys_errors_name():
    keys = keys_named_in_errors()
    # A few that must be seen, from different modules (resolve, rewards, load, watchdog rules).
    assert {"rollout.tensor_parallel_size", "critic.warmup_updates", "data.reward_fn", "data.gsm8k_method"} <= set(keys)
    assert len(keys) >= 20, sorted(keys)


def test_every_key_an_error_names_exists():
    unknown = {}
    for key, where in sorted(keys_named_in_errors().items()):
        try:
            explain(key)
        except ConfigError as exc:
            unknown[key] = (where, str(exc))
    assert not unknown, "\n".join(f"{k} ({', '.join(w)}): {e}" for k, (w, e) in unknown.items())


def test_a_wrong_key_would_be_caught():
    source = """
REWARD_KEY = "reward"
def f(x):
    if x:
        raise ConfigError(f"unknown method {x!r}", key="reward.gsm8k.method")
    raise ResolveError(f"actor.no_such_key={x} does not fit; see site.slurm.nope and plan.nope, or model.path",
                       hint="-o data.reward_fn=...")
"""
    keys = keys_in_source(source, "snippet", {})
    assert keys == {"reward.gsm8k.method": ["snippet:5"], "actor.no_such_key": ["snippet:6"],
                    "site.slurm.nope": ["snippet:6"], "plan.nope": ["snippet:6"], "model.path": ["snippet:6"],
                    "data.reward_fn": ["snippet:6"]}
    for key in ("reward.gsm8k.method", "actor.no_such_key", "site.slurm.nope", "plan.nope"):
        with pytest.raises(ConfigError):
            explain(key)


def test_roots_cover_the_schema():
    assert {"site", "plan", "actor", "data"} <= set(_SECTIONS) and attrs.has(Site) and attrs.has(RunPlan)
