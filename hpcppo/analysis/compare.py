"""``hpcppo compare RUN1 RUN2 ...``: the config keys in which runs differ, and their outcomes side by side. No torch.

Config: every experiment, site (``site.*``) and plan (``plan.*``) key of each run's ``resolved.toml``, listed
as ``hpcppo config show`` lists them (:func:`hpcppo.config.provenance_rows`), and the keys whose values are not
the same in every run. A ``resolved.toml`` this version cannot load (written by another hpcppo version, edited)
is flattened as plain TOML instead, with a note. A run given as a bare metric file has no config.

Outcomes: from :func:`hpcppo.analysis.summary.summarize_target` of each run: steps, wall time, the last,
smoothed and best values of :data:`OUTCOMES`, the first non-finite value and the watchdog's actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpcppo.analysis.summary import duration, fmt, steps_text, summarize_target
from hpcppo.analysis.targets import Target, resolved_data
from hpcppo.config import load_resolved, provenance_rows
from hpcppo.config.fields import fmt_value
from hpcppo.errors import ConfigError, HpcppoError
from hpcppo.rundir import metric_names
from hpcppo.rundir.events import kind_tail, shown_in

OUTCOMES: tuple[str, ...] = metric_names.headline_names("compare")
_WATCHDOG_KINDS = shown_in("compare")  # the "watchdog / stops" row


def _flatten(data: Any, prefix: str, out: dict[str, str]) -> None:
    if isinstance(data, dict) and data:
        for k, v in data.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = fmt_value(data)


def config_keys(target: Target) -> tuple[dict[str, str], str | None]:
    """``{key: value as TOML text}`` of ``target``'s resolved config, and a note when it was read as plain TOML."""
    if target.resolved is None or not target.resolved.is_file():
        return {}, "no resolved.toml (a bare metric file)"

    try:
        return {key: value for key, value, _ in provenance_rows(load_resolved(target.resolved))}, None
    except ConfigError as e:
        data = resolved_data(target)
        out: dict[str, str] = {}
        for section, prefix in (("experiment", ""), ("site", "site"), ("plan", "plan")):
            _flatten(data.get(section, {}), prefix, out)
        return out, f"read as plain TOML ({e})"


def differing_keys(configs: Sequence[dict[str, str]]) -> list[str]:
    """Keys whose value is not the same in every config (a key missing from one counts as differing), in the
    order of the first config that has them."""
    keys: list[str] = []
    seen: set[str] = set()
    for config in configs:
        for k in config:
            if k not in seen:
                seen.add(k)
                keys.append(k)
    return [k for k in keys if len({c.get(k) for c in configs}) > 1]


def compare(targets: Sequence[Target], *, locking: bool | None = None) -> dict[str, Any]:
    """The comparison as plain data (what ``--json`` prints).

    Raises:
        HpcppoError: fewer than two runs.
        RunStateError, PathError: a run that has nothing to show or cannot be read (as for ``metrics summary``).
    """
    if len(targets) < 2:
        raise HpcppoError(f"compare needs two runs or more, got {len(targets)}")
    summaries = [summarize_target(t, locking=locking) for t in targets]
    configs, notes = [], []
    for t in targets:
        config, note = config_keys(t)
        configs.append(config)
        if note:
            notes.append(f"{t.name}: {note}")
    keys = differing_keys([c for c in configs if c])
    return {
        "runs": [s["run"] for s in summaries],
        "config": {k: [c.get(k) if c else None for c in configs] for k in keys},
        "config_notes": notes,
        "summaries": summaries,
    }


def _outcome_rows(summaries: Sequence[dict[str, Any]]) -> list[tuple[str, list[str], int | None]]:
    """``(label, cells, index of the best run or None)`` rows of the outcome table."""
    rows: list[tuple[str, list[str], int | None]] = [
        ("steps", [steps_text(s) for s in summaries], None),
        ("wall time", [duration(s["wall_s"]) for s in summaries], None),
    ]

    def stat_row(label: str, values: list[float | None], goal: str | None) -> None:
        best = None
        known = [(v, i) for i, v in enumerate(values) if v is not None and v == v]
        if goal and len(known) > 1:
            best = (max if goal == "max" else min)(known)[1]
        rows.append((label, [fmt(v) for v in values], best))

    for name in OUTCOMES:
        stats = [s["metrics"].get(name) for s in summaries]
        if not any(stats):
            continue
        goal = next((st["goal"] for st in stats if st), None)
        stat_row(f"{name} last", [st["last"] if st else None for st in stats], goal)
        stat_row(f"{name} smoothed", [st["smoothed"] if st else None for st in stats], goal)
        if goal:
            stat_row(f"{name} best", [st["best"] if st else None for st in stats], goal)
    rows.append(("first non-finite", ["-" if s["first_nonfinite"] is None else f"step {s['first_nonfinite']['step']}"
                                      for s in summaries], None))

    def watchdog(s: dict[str, Any]) -> str:
        counts: dict[str, int] = {}
        for kind, n in s["events"]["counts"].items():
            tail = kind_tail(kind)
            if tail in _WATCHDOG_KINDS:
                counts[tail] = counts.get(tail, 0) + n
        return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "-"

    rows.append(("watchdog / stops", [watchdog(s) for s in summaries], None))
    return rows


def render(result: dict[str, Any]) -> Any:
    """Two rich tables: the differing config keys, then the outcomes (the best run of a row in bold)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    runs = result["runs"]
    parts: list[Any] = []
    config = Table(title=f"config: {len(result['config'])} key(s) differ", title_justify="left", show_edge=False)
    config.add_column("key", no_wrap=True)
    for run in runs:
        config.add_column(run, overflow="fold", max_width=48)
    for key, values in result["config"].items():
        config.add_row(key, *["(absent)" if v is None else v for v in values])
    parts.append(config if result["config"] else Text("config: no key differs"))
    parts.extend(Text(f"note: {n}", style="yellow") for n in result["config_notes"])
    outcome = Table(title="outcome (current history)", title_justify="left", show_edge=False)
    outcome.add_column("", no_wrap=True)
    for run in runs:
        outcome.add_column(run, justify="right", overflow="fold", max_width=48)
    for label, cells, best in _outcome_rows(result["summaries"]):
        outcome.add_row(label, *[Text(c, style="bold" if i == best else "") for i, c in enumerate(cells)])
    parts.append(Text(""))
    parts.append(outcome)
    return Group(*parts)
