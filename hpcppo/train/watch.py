"""The watchdog inside the trainer: rules judged on every step's row, at the step boundary (0 steps of latency).

Rank 0 runs the pure :func:`hpcppo.watchdog.decide` on the rows of the current branch and broadcasts the
:class:`~hpcppo.watchdog.Decision`, so every rank applies the same actions before the next step even if their views
of a metric could differ. The rule state and the recent rows go into every checkpoint (:meth:`state_dict`), so a
run killed and resumed decides exactly as an uninterrupted one. What the actions *do* to the models is the
trainer's business (:meth:`hpcppo.train.trainer.Trainer.obey`); this class keeps the books: decisions, history,
and the audit trail (events in the HDF5 log and in ``runs/<id>/events.jsonl``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from hpcppo.distributed.env import broadcast_object
from hpcppo.metrics import MetricsWriter
from hpcppo.rundir.events import append_event
from hpcppo.watchdog import Action, Decision, WatchdogState, decide, rollback_target

log = logging.getLogger("hpcppo.train")


class RuleKeeper:
    """The rules of ``[watchdog]``, their state, and the rows they judge."""

    def __init__(self, rules: Sequence[Any], *, enabled: bool, rank: int, run_dir: Path,
                 metrics: MetricsWriter | None, attempt: int | None):
        self.rules = list(rules) if enabled else []
        self.by_name = {r.name: r for r in self.rules}
        self.rank = rank
        self.run_dir = run_dir
        self.metrics = metrics
        self.attempt = attempt
        self.state = WatchdogState()
        self.history: list[dict[str, float]] = []
        # drop_frac looks back `window` finite values; a few missing ones must not starve it.
        self.keep = 4 * max((r.window for r in self.rules if r.condition == "drop_frac"), default=1) + 1

    # ------------------------------------------------------------------ decisions
    def judge(self, step: int, row: Mapping[str, float]) -> Decision:
        """Add this step's row and decide (collective when there are rules: rank 0 decides, everyone follows)."""
        self.history.append({"step": float(step), **{k: float(v) for k, v in row.items()}})
        del self.history[:-self.keep]
        if not self.rules:
            return Decision(actions=(), state=self.state)
        decision = decide(self.history, self.rules, self.state) if self.rank == 0 else None
        decision = broadcast_object(decision)
        self.state = decision.state
        return decision

    def target_before_anomaly(self, action: Action, committed: Sequence[int]) -> int | None:
        """The newest committed checkpoint from before the anomaly that ``action`` answers began."""
        return rollback_target(committed, action.step, self.history, self.by_name[action.rule])

    def rolled_back_to(self, step: int) -> None:
        """Forget the rows of the abandoned branch (the next rows continue from ``step``)."""
        self.history = [r for r in self.history if r["step"] <= step]

    def compose_lr_scale(self, factor: float) -> float:
        """A rollback asked for outside the rules (``hpcppo rollback``) composes with theirs; returns the total."""
        self.state = attrs.evolve(self.state, lr_scale=self.state.lr_scale * float(factor))
        return self.state.lr_scale

    def grad_clip(self, configured: float) -> float:
        return configured if self.state.grad_clip is None else min(configured, self.state.grad_clip)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {"state": self.state.to_dict(), "history": [dict(r) for r in self.history]}

    def load_state_dict(self, saved: Mapping[str, Any] | None) -> None:
        if saved:
            self.state = WatchdogState.from_dict(saved["state"])
            self.history = [dict(r) for r in saved["history"]]

    # ------------------------------------------------------------------ audit trail
    def record(self, step: int, kind: str, message: str, *, source: str = "watchdog", **details: Any) -> None:
        """One event, in the HDF5 log and in ``events.jsonl`` (rank 0), and in the job log (every rank)."""
        log.warning("%s at step %d: %s", kind, step, message)
        if self.rank != 0:
            return
        if self.metrics is not None:
            self.metrics.log_event(step, kind, message[:1000])
        append_event(self.run_dir, kind=kind, step=step, source=source, message=message, attempt=self.attempt,
                     **details)


def describe(action: Action) -> dict[str, Any]:
    """The fields of an action worth keeping in an event."""
    return {k: v for k, v in action.to_dict().items() if v is not None and k not in ("kind", "step")}

