"""``explain(key)`` (help, type, default, allowed values of any key) and the provenance table of
``hpcppo config show``. Plain text; the CLI may dress it up."""

from __future__ import annotations

import re
import typing
from typing import Any

import attrs

from hpcppo.verl import names as verl
from hpcppo.config.compiled import Compiled
from hpcppo.config.convert import is_section, section_class, section_fields, type_text
from hpcppo.config.experiment import Experiment
from hpcppo.config.fields import did_you_mean, fmt_value
from hpcppo.config.load import leaf_keys
from hpcppo.config.plan import RunPlan
from hpcppo.config.site import Site
from hpcppo.config.watchdog import Rule, default_rules
from hpcppo.errors import ConfigError

__all__ = ["explain", "provenance_rows", "render_provenance"]

_ROOTS: dict[str, type] = {"": Experiment, "site.": Site, "plan.": RunPlan}


def _element_class(attribute: attrs.Attribute[Any]) -> type | None:
    """The attrs class of a ``list[Cls]`` field (e.g. watchdog.rules -> Rule), else None."""
    if typing.get_origin(attribute.type) is list:
        (arg,) = typing.get_args(attribute.type)
        if attrs.has(arg):
            return arg
    return None


def _default_text(attribute: attrs.Attribute[Any]) -> str:
    default: Any = attribute.default
    if default is attrs.NOTHING:
        return "(required)"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        value = default.factory()
    else:
        value = default
    if attrs.has(type(value)):
        return "(section)"
    return fmt_value(value)


def _describe(key: str, attribute: attrs.Attribute[Any]) -> str:
    lines = [key, f"  {attribute.metadata.get('help', '')}"]
    element = _element_class(attribute)
    if is_section(attribute):
        lines.append("  keys:")
        for name, sub in section_fields(section_class(attribute)).items():
            lines.append(f"    {name:<30} {sub.metadata.get('help', '')}")
        return "\n".join(lines)
    lines.append(f"  type:    {type_text(attribute.type)}")
    if key == "watchdog.rules":
        lines.append("  default: the built-in rules (set watchdog.defaults = false to drop them):")
        lines.extend(f"    {_rule_text(r)}" for r in default_rules())
    else:
        lines.append(f"  default: {_default_text(attribute)}")
    allowed = attribute.metadata.get("allowed")
    if callable(allowed):  # choices a registry declares (e.g. algorithm.adv_estimator)
        allowed = allowed()
    if allowed:
        lines.append(f"  allowed: {allowed}")
    if element is not None:
        lines.append(f"  each element has keys: {', '.join(section_fields(element))}")
    return "\n".join(lines)


def explain(key: str) -> str:
    """Help, type, default and allowed values of a dotted key (``actor.lr``, ``site.slurm.partition``,
    ``plan.world_size``, ``watchdog.rules.action``); a section lists its keys. ConfigError if unknown."""
    key = key.strip()
    if not key:  # an empty argument is a slip (an unset shell variable), not a request for the whole tree
        top = ", ".join([*section_fields(_ROOTS[""]), "site", "plan"])
        raise ConfigError(f"config explain: empty key; name one, e.g. actor.lr (a section lists its keys); "
                          f"top-level keys: {top}")
    if key in ("site", "plan"):
        key += "."
    prefix = next(p for p in ("site.", "plan.", "") if key.startswith(p))
    root = _ROOTS[prefix]
    bare = key[len(prefix):]
    if not bare:
        root_name = {"": "experiment", "site.": "site", "plan.": "plan"}[prefix]
        lines = [f"{root_name} keys:"]
        for name, field in section_fields(root).items():
            lines.append(f"  {prefix}{name:<30} {field.metadata.get('help', '')}")
        return "\n".join(lines)
    current: type = root
    parts = bare.split(".")
    attribute: attrs.Attribute[Any] | None = None
    for i, part in enumerate(parts):
        fields = section_fields(current)
        if part not in fields:
            pointer = verl.describe(key) if not prefix else None
            if pointer is not None:  # a verl name: say what it is here, then explain that key
                entry = verl.lookup(key)
                target = entry.hpcppo if entry is not None else _single_target(key)
                return pointer + (f"\n\n{explain(target)}" if target else "")
            shown = prefix + ".".join(parts[: i + 1])
            extra = "" if prefix or i else " (site keys start with 'site.', derived ones with 'plan.')"
            raise ConfigError(f"unknown key{did_you_mean(part, fields)}; known keys here: {', '.join(fields)}{extra}",
                              key=shown)
        attribute = fields[part]
        if i < len(parts) - 1:
            nxt = attribute.type if is_section(attribute) else _element_class(attribute)
            if nxt is None:
                raise ConfigError(f"is a {type_text(attribute.type)} and has no keys", key=prefix + ".".join(parts[: i + 1]))
            current = nxt
    assert attribute is not None
    return _describe(key, attribute)


def _single_target(key: str) -> str:
    """The one hpcppo key a partial verl name (``actor.optim.lr``) points at, else ""."""
    found = re.findall(r"in hpcppo this is `([^`]+)`", verl.hint(key) or "")
    return found[0] if len(found) == 1 else ""


def _rule_text(rule: Rule) -> str:
    cond = {"gt": ">", "lt": "<"}.get(rule.condition)
    if cond:
        when = f"{rule.metric} {cond} {rule.threshold:g}"
    elif rule.condition == "nonfinite":
        when = f"{rule.metric} is NaN/inf"
    else:
        when = f"{rule.metric} drops > {rule.threshold:.0%} below its {rule.window}-step mean"
    extra = {"raise_kl_coef": f" x{rule.factor:g} in [{rule.min_value:g}, {rule.max_value:g}]",
             "rollback": f", lr x{rule.lr_scale:g}", "set_grad_clip": f" {rule.grad_clip:g}"}.get(rule.action, "")
    return f"{rule.name}: {when} -> {rule.action}{extra} (cooldown {rule.cooldown_steps}, max {rule.max_count})"


def _value_text(value: Any) -> str:
    if isinstance(value, list) and value and isinstance(value[0], Rule):
        return "; ".join(_rule_text(r) for r in value)
    return fmt_value(value)


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def provenance_rows(compiled: Compiled) -> list[tuple[str, str, str]]:
    """``(key, value, source)`` for every experiment, site and plan key; plan rows have source ``resolved``."""
    rows: list[tuple[str, str, str]] = []
    for key in leaf_keys(Experiment):
        rows.append((key, _value_text(_get(compiled.experiment, key)), compiled.provenance.get(key, "default")))
    for key in leaf_keys(Site):
        full = f"site.{key}"
        rows.append((full, _value_text(_get(compiled.site, key)), compiled.provenance.get(full, "default")))
    for key in leaf_keys(RunPlan):
        rows.append((f"plan.{key}", _value_text(_get(compiled.plan, key)), "resolved"))
    return rows


def render_provenance(compiled: Compiled, *, only_set: bool = False) -> str:
    """The resolved config as a plain-text table ``key  value  source``; ``only_set`` hides defaults."""
    rows = [r for r in provenance_rows(compiled) if not (only_set and r[2] == "default")]
    width = max(len(r[0]) for r in rows)
    vwidth = min(48, max(len(r[1]) for r in rows))
    head = [f"# experiment {compiled.experiment.name!r} from {compiled.spec_path or '?'}",
            f"# site {compiled.site.name!r} from {compiled.site_path or '?'}",
            f"{'key':<{width}}  {'value':<{vwidth}}  source"]
    body = [f"{k:<{width}}  {v:<{vwidth}}  {s}" for k, v, s in rows]
    return "\n".join(head + body) + "\n"
