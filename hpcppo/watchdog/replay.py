"""Replay the watchdog rules over a finished run's metric rows: what would have fired, and when.

Replay cannot re-run training: after a rollback (or a pause) it keeps judging the logged trajectory, so
it shows what the rules say about the run as it happened, not what the retried branch would have
become. Pass the rows of one branch (the reader's default view: the latest attempt of each step).
Pure: rows are plain mappings, no I/O and no pandas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from hpcppo.watchdog.decide import Action, Decision, WatchdogState, decide

if TYPE_CHECKING:
    from hpcppo.config.watchdog import Rule

__all__ = ["replay", "format_replay"]


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
