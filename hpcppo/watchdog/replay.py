"""Replay the watchdog rules over a finished run's metric rows: what would have fired, and when.

Replay cannot re-run training: after a rollback (or a pause) it keeps judging the logged trajectory, so
it shows what the rules say about the run as it happened, not what the retried branch would have
become. Pass the rows of one branch (the reader's default view: the latest attempt of each step).
Pure: rows are plain mappings, no I/O and no pandas — except :func:`load_rules`, which reads a rules file
for ``hpcppo watchdog replay --rules``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from hpcppo.config.convert import read_toml, structure
from hpcppo.config.fields import did_you_mean
from hpcppo.config.watchdog import Rule, WatchdogSection
from hpcppo.errors import ConfigError
from hpcppo.watchdog.decide import PRECEDENCE, Action, Decision, WatchdogState, decide

if TYPE_CHECKING:
    import os

__all__ = ["replay", "format_replay", "logged_rows", "summarize_replay", "load_rules"]


class _Rows(Sequence[Mapping[str, Any]]):
    """rows[start:stop] without the copy: decide only looks back as far as it needs, so a step costs
    O(window) however long the run, instead of O(step) for a sliced list."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], start: int, stop: int):
        self._rows, self._start, self._len = rows, start, stop - start

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> Mapping[str, Any]: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Mapping[str, Any]]: ...

    def __getitem__(self, i: int | slice) -> Mapping[str, Any] | Sequence[Mapping[str, Any]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._len))]
        j = i + self._len if i < 0 else i
        if not 0 <= j < self._len:
            raise IndexError(i)
        return self._rows[self._start + j]


def replay(rows: Sequence[Mapping[str, Any]], rules: Sequence[Rule], *,
           window_keep: int | None = None) -> list[tuple[int, Decision]]:
    """``(step, decision)`` for every step on which an action was applied, oldest first.

    The history grows row by row, as in the trainer. ``window_keep`` (>= 1) keeps only the newest rows,
    to mimic a trainer that holds a bounded history (e.g. the largest drop_frac window + 1, where a NaN
    inside the window then shortens it); None keeps the whole prefix, at no extra cost.
    """
    if window_keep is not None and window_keep < 1:
        raise ValueError(f"window_keep must be >= 1 or None, got {window_keep}")
    state = WatchdogState()
    results: list[tuple[int, Decision]] = []
    for stop in range(1, len(rows) + 1):
        start = 0 if window_keep is None else max(0, stop - window_keep)
        decision = decide(_Rows(rows, start, stop), rules, state)
        state = decision.state
        if decision.actions:
            results.append((decision.actions[0].step, decision))
    return results


def _effect(action: Action, decision: Decision) -> str:
    """What applying the action changes, in the state's terms where the state tracks it."""
    if action.kind == "rollback":
        return f"lr x{action.lr_scale:g}, total x{decision.state.lr_scale:g}"
    if action.kind == "raise_kl_coef":
        return f"kl_coef x{action.factor:g}, within [{action.min_value:g}, {action.max_value:g}]"
    if action.kind == "set_grad_clip":
        return f"grad clip {action.grad_clip:g}, now {decision.state.grad_clip:g}"
    return {"pause": "checkpoint and stop, no requeue", "requeue": "stop and requeue",
            "restart_critic": "critic from its last good weights"}[action.kind]


def format_replay(results: Sequence[tuple[int, Decision]]) -> list[str]:
    """One aligned line per applied or suppressed action, e.g.
    ``step 12  kl_rollback        rollback      kl/actor_ref=0.083 > 0.05  (lr x0.5, total x0.5)``."""
    width = max((len(str(step)) for step, _ in results), default=1)
    lines: list[str] = []
    for step, decision in results:
        for action in decision.actions:
            lines.append(f"step {step:<{width}}  {action.rule:<18} {action.kind:<13} {action.reason}  "
                         f"({_effect(action, decision)})")
        for action in decision.suppressed:
            by = decision.superseded_by(action)
            note = f"suppressed by {by.kind} ({by.rule})" if by else "suppressed"
            lines.append(f"step {step:<{width}}  {action.rule:<18} {action.kind:<13} {action.reason}  ({note})")
    return lines


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def logged_rows(rows: Sequence[Mapping[str, Any]], rules: Sequence[Rule]) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows read back from the metric log with the NaNs that mean "not logged" removed, and notes on the rest.

    The HDF5 log writes NaN both for a metric not logged at a step and for a NaN value, and the trainer hands
    ``decide`` only what it logged, so a NaN must be guessed. A metric's NaNs before its first non-NaN value
    are dropped: a column never logged (``critic/*`` without a critic) or not logged yet (``actor/*`` during
    critic warm-up). NaNs after it stay, as values. That changes only ``nonfinite`` rules (NaN never satisfies
    gt/lt, and drop_frac skips it), so a note names each such rule whose metric had NaNs dropped or kept:
    a metric logged only every few steps (``val/score``) would make it fire between them, and a metric NaN
    from its very first step would be missed.
    """
    first: dict[str, int] = {}
    for i, row in enumerate(rows):
        for k, v in row.items():
            if k not in first and not _is_nan(v):
                first[k] = i
    out = [{k: v for k, v in row.items() if not _is_nan(v) or first.get(k, len(rows)) < i}
           for i, row in enumerate(rows)]
    notes: list[str] = []
    for rule in rules:
        if rule.condition != "nonfinite" or not rows:
            continue
        metric, start = rule.metric, first.get(rule.metric)
        nan_steps = [int(row["step"]) for row in out if _is_nan(row.get(metric))]
        if start is None and any(metric in row for row in rows):
            notes.append(f"rule {rule.name}: {metric} is NaN in every row; taken as never logged, so the rule "
                         f"cannot fire (the log cannot tell a NaN value from a value not logged)")
        elif start is not None and start > 0:
            notes.append(f"rule {rule.name}: {metric} is NaN before step {int(rows[start]['step'])}; taken as not "
                         f"logged yet")
        if nan_steps:
            shown = ", ".join(map(str, nan_steps[:8])) + (", ..." if len(nan_steps) > 8 else "")
            notes.append(f"rule {rule.name}: {metric} is NaN at {len(nan_steps)} step(s) after it was first logged "
                         f"({shown}); taken as NaN values (a metric logged only every few steps would look the same)")
    return out, notes


def summarize_replay(results: Sequence[tuple[int, Decision]], steps: int) -> str:
    """The closing line: ``3 actions would have fired over 40 steps: 2 rollback, 1 raise_kl_coef``."""
    counts = {kind: 0 for kind in PRECEDENCE}
    suppressed = 0
    for _, decision in results:
        for action in decision.actions:
            counts[action.kind] = counts.get(action.kind, 0) + 1
        suppressed += len(decision.suppressed)
    total = sum(counts.values())
    over = f"over {steps} step{'s' if steps != 1 else ''}"
    if not total:
        return f"no rule would have fired {over}"
    kinds = ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)
    line = f"{total} action{'s' if total != 1 else ''} would have fired {over}: {kinds}"
    if suppressed:
        line += f" ({suppressed} more matched but {'was' if suppressed == 1 else 'were'} suppressed)"
    return line


def load_rules(path: str | os.PathLike[str]) -> list[Rule]:
    """The effective rules of a rules file: ``[[rules]]`` tables as in ``[[watchdog.rules]]``, and an optional
    ``defaults = true|false`` (true, the default: the built-in rules, replaced by name by yours).

    Validated like a spec: ``ConfigError`` naming the file and the key (``rules[1].action``).
    """
    label = str(path)
    data = read_toml(path)
    known = ("defaults", "rules")
    for key in data:
        if key not in known:
            raise ConfigError(f"unknown key{did_you_mean(key, known)}; known keys here: {', '.join(known)}",
                              file=label, key=key)
    return list(structure(data, WatchdogSection, file=label).rules)
