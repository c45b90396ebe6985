"""Pure watchdog decisions: which rules fire on the step just computed, and which of them are applied.

Rank 0 calls :func:`decide` at every step boundary and broadcasts the :class:`Decision`; every rank
applies it before the next step. Nothing here reads files, clocks or tensors, so a decision depends
only on the rows, the rules and the :class:`WatchdogState` — the state goes into the checkpoint, and a
resumed run decides exactly as the original did. ``replay`` runs the same function over a finished log.

Precedence, highest first (``PRECEDENCE``, from the actions' table :mod:`hpcppo.rule_actions`): ``pause``,
``requeue``, ``rollback``, ``restart_critic``, ``raise_kl_coef``, ``set_grad_clip``. When several rules match on
one step:

- ``pause`` or ``requeue`` stops the run, so it is the only action applied (a pause beats a requeue:
  stopping for a human is stronger than retrying); everything else that matched is suppressed.
- ``rollback`` reloads actor and critic, so it suppresses ``restart_critic``. ``raise_kl_coef`` and
  ``set_grad_clip`` still apply: the retried branch runs with a stronger KL penalty / a tighter clip.
- One action per kind: the first matching rule in rule-list order wins (for a rollback, its lr_scale is
  the one applied), except ``set_grad_clip`` where the tightest clip wins — the state's clip only ever
  tightens, so applying both would end at the smallest anyway.

A suppressed rule was matched but not applied: it is reported and consumes neither its max_count nor
its cooldown, so it can still act on a later step once the stronger action is done.

After a rollback the trainer must keep the Decision's state, not restore the checkpoint's: restoring it
would forget the rollback itself (its count, its lr_scale). Cooldown windows are step numbers: a rule
that fired at step s is quiet for s+1 .. s+cooldown_steps, so on the branch retried after a rollback
(steps <= s again) it judges afresh; max_count bounds how often that can repeat.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from hpcppo import rule_actions

if TYPE_CHECKING:  # only attributes are read: no import of the config package at run time
    from hpcppo.config.watchdog import Rule

__all__ = ["PRECEDENCE", "Action", "Decision", "WatchdogState", "decide", "rollback_target",
           "unknown_metrics"]

PRECEDENCE: tuple[str, ...] = rule_actions.PRECEDENCE
STOPS: tuple[str, ...] = rule_actions.STOPS  # pause, requeue
_RETIRED_KEYS = ("kl_coef",)  # in checkpoints' watchdog state before the training state alone held the coefficient

Row = Mapping[str, Any]


@attrs.frozen(kw_only=True)
class WatchdogState:
    """What the watchdog has done so far in the run; decide returns a new one, never edits this one.

    The dicts are plain (a Decision is pickled for the broadcast and the state saved with
    ``weights_only=True``) and are never mutated after construction.
    """

    fired: dict[str, int] = attrs.field(factory=dict)  # times applied (suppressed matches do not count)
    last_fired: dict[str, int] = attrs.field(factory=dict)  # step of the last application: cooldown starts there
    lr_scale: float = 1.0  # product over the rollbacks applied: the trainer multiplies its base lr by it
    grad_clip: float | None = None  # set by set_grad_clip; None = the config's
    paused_by: str | None = None  # the rule whose action paused the run; re-armed when a person resumes it

    def paused(self, rule: str) -> WatchdogState:
        """The state of a run that ``rule`` paused."""
        return attrs.evolve(self, paused_by=rule)

    def rearmed(self) -> WatchdogState:
        """A person resumed the paused run: the rule that paused it may fire again (one more of its ``max_count``),
        so that a second excursion pauses it again instead of passing unwatched."""
        if self.paused_by is None:
            return self
        fired = dict(self.fired)
        if fired.get(self.paused_by, 0) > 0:
            fired[self.paused_by] -= 1
        return attrs.evolve(self, fired=fired, paused_by=None)

    def to_dict(self) -> dict[str, Any]:
        """Only str/int/float/None/dict: loadable with ``torch.load(weights_only=True)`` and JSON."""
        return {"fired": dict(self.fired), "last_fired": dict(self.last_fired), "lr_scale": float(self.lr_scale),
                "grad_clip": self.grad_clip, "paused_by": self.paused_by}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WatchdogState:
        """Missing keys take their defaults; an unknown key is an error (a state of another version). ``kl_coef``,
        which checkpoints before the training state held the coefficient alone recorded here, is read and dropped:
        their coefficient is the ``kl_ctrl`` entry's."""
        unknown = sorted(set(d) - {f.name for f in attrs.fields(cls)} - set(_RETIRED_KEYS))
        if unknown:
            raise ValueError(f"unknown watchdog state key(s) {unknown}; expected fired, last_fired, lr_scale, "
                             f"grad_clip, paused_by")
        return cls(fired={str(k): int(v) for k, v in d.get("fired", {}).items()},
                   last_fired={str(k): int(v) for k, v in d.get("last_fired", {}).items()},
                   lr_scale=float(d.get("lr_scale", 1.0)), grad_clip=_opt_float(d.get("grad_clip")),
                   paused_by=None if d.get("paused_by") is None else str(d["paused_by"]))


def _opt_float(x: Any) -> float | None:
    return None if x is None else float(x)


@attrs.frozen(kw_only=True)
class Action:
    """A rule that matched on ``step``: what to do, why, and the rule's parameters for that action."""

    kind: str
    rule: str
    metric: str
    value: float  # may be nan or inf (nonfinite rules)
    threshold: float
    step: int
    reason: str  # one sentence for humans, e.g. "kl/actor_ref=0.083 > 0.05"
    factor: float | None = None
    min_value: float | None = None
    max_value: float | None = None
    lr_scale: float | None = None  # the rule's factor; the state holds the product over the run
    grad_clip: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """For events.jsonl; a non-finite ``value`` stays a float (Python's json writes NaN/Infinity)."""
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class Decision:
    """The actions to apply before the next step (precedence order) and the state after them."""

    actions: tuple[Action, ...]
    state: WatchdogState
    suppressed: tuple[Action, ...] = ()

    def action(self, kind: str) -> Action | None:
        return next((a for a in self.actions if a.kind == kind), None)

    @property
    def stops(self) -> bool:
        """The run stops after this step (pause or requeue)."""
        return any(a.kind in STOPS for a in self.actions)

    @property
    def rollback(self) -> Action | None:
        return self.action("rollback")

    def superseded_by(self, suppressed: Action) -> Action | None:
        """The applied action that made ``suppressed`` unnecessary (for the event message)."""
        if self.stops:
            return self.actions[0]
        if suppressed.kind == "restart_critic" and self.rollback:
            return self.rollback
        return self.action(suppressed.kind)

    def to_dict(self) -> dict[str, Any]:
        return {"actions": [a.to_dict() for a in self.actions], "suppressed": [a.to_dict() for a in self.suppressed],
                "state": self.state.to_dict()}


def _step(row: Row) -> int:
    try:
        return int(row["step"])
    except KeyError:
        raise ValueError(f"a watchdog history row has no 'step': {sorted(row)}") from None


def _value(row: Row, metric: str) -> float | None:
    """None when the row does not carry the metric: the rule cannot judge that row."""
    v = row.get(metric)
    return None if v is None else float(v)


def _holds(rule: Rule, v: float) -> bool:
    """gt/lt/nonfinite on one value; NaN compares false, so it never satisfies gt or lt."""
    if rule.condition == "gt":
        return v > rule.threshold
    if rule.condition == "lt":
        return v < rule.threshold
    if rule.condition == "nonfinite":
        return not math.isfinite(v)
    raise ValueError(f"rule {rule.name!r}: condition {rule.condition!r} is not judged on one value")


def _drop_reason(rule: Rule, history: Sequence[Row], v: float) -> str | None:
    """drop_frac: v against the mean of the `window` newest finite values before it.

    Missing or non-finite values in the earlier rows are skipped (the window reaches further back), so
    one NaN row does not blind the rule; until `window` finite values exist it cannot fire. A non-finite
    v never fires (nonfinite rules handle that), and a zero mean cannot fire: a relative drop from 0 is
    undefined.
    """
    if not math.isfinite(v):
        return None
    recent: list[float] = []
    for i in range(len(history) - 2, -1, -1):
        x = _value(history[i], rule.metric)
        if x is not None and math.isfinite(x):
            recent.append(x)
            if len(recent) == rule.window:
                break
    if len(recent) < rule.window:
        return None
    mean = math.fsum(recent) / rule.window
    limit = mean - rule.threshold * abs(mean)
    if mean == 0.0 or not v < limit:
        return None
    return f"{rule.metric}={v:.4g} < {limit:.4g} ({rule.threshold:.0%} below its {rule.window}-step mean {mean:.4g})"


def _reason(rule: Rule, v: float) -> str:
    if rule.condition == "nonfinite":
        return f"{rule.metric}={v} is not finite"
    return f"{rule.metric}={v:.4g} {'>' if rule.condition == 'gt' else '<'} {rule.threshold:.4g}"


def _match(rule: Rule, history: Sequence[Row], step: int) -> Action | None:
    v = _value(history[-1], rule.metric)
    if v is None:
        return None
    if rule.condition == "drop_frac":
        reason = _drop_reason(rule, history, v)
    else:
        reason = _reason(rule, v) if _holds(rule, v) else None
    if reason is None:
        return None
    params: dict[str, float] = {p: getattr(rule, p) for p in rule_actions.lookup(rule.action).params}
    return Action(kind=rule.action, rule=rule.name, metric=rule.metric, value=v, threshold=rule.threshold,
                  step=step, reason=reason, **params)


def _eligible(rule: Rule, state: WatchdogState, step: int) -> bool:
    if state.fired.get(rule.name, 0) >= rule.max_count:  # max_count 0: never
        return False
    last = state.last_fired.get(rule.name)
    return last is None or not (last < step <= last + rule.cooldown_steps)


def _clip(action: Action) -> float:
    """A set_grad_clip action's clip (every one carries it, see _match)."""
    return math.inf if action.grad_clip is None else action.grad_clip


def _arbitrate(matched: list[Action]) -> tuple[tuple[Action, ...], tuple[Action, ...]]:
    """Split matched actions into applied and suppressed, both in precedence order (module docstring)."""
    by_kind = {kind: [a for a in matched if a.kind == kind] for kind in PRECEDENCE}
    stop = next((by_kind[kind] for kind in STOPS if by_kind[kind]), [])
    keep: list[Action] = [stop[0]] if stop else []
    if not stop:
        for kind in (k for k in PRECEDENCE if k not in STOPS):
            found = by_kind[kind]
            if not found or (kind == "restart_critic" and by_kind["rollback"]):
                continue
            # min() keeps the first of equal clips, i.e. rule-list order among ties.
            keep.append(min(found, key=_clip) if kind == "set_grad_clip" else found[0])
    suppressed = [a for kind in PRECEDENCE for a in by_kind[kind] if not any(a is k for k in keep)]
    return tuple(keep), tuple(suppressed)


def _advance(state: WatchdogState, applied: tuple[Action, ...]) -> WatchdogState:
    if not applied:
        return state
    fired, last = dict(state.fired), dict(state.last_fired)
    lr_scale, grad_clip = state.lr_scale, state.grad_clip
    for a in applied:
        fired[a.rule] = fired.get(a.rule, 0) + 1
        last[a.rule] = a.step
        if a.kind == "rollback" and a.lr_scale is not None:
            lr_scale *= a.lr_scale
        elif a.kind == "set_grad_clip" and a.grad_clip is not None:
            grad_clip = a.grad_clip if grad_clip is None else min(grad_clip, a.grad_clip)
    return attrs.evolve(state, fired=fired, last_fired=last, lr_scale=lr_scale, grad_clip=grad_clip)


def decide(history: Sequence[Row], rules: Sequence[Rule], state: WatchdogState) -> Decision:
    """Judge the last row of ``history`` (the current branch, oldest first; each row has ``step``).

    Only drop_frac looks at earlier rows, and only as far back as its window needs. A row without a
    rule's metric (or with None) leaves that rule quiet: not every metric is logged at every step.
    """
    if not history:
        return Decision(actions=(), state=state)
    step = _step(history[-1])
    matched = [a for rule in rules
               if _eligible(rule, state, step) and (a := _match(rule, history, step)) is not None]
    applied, suppressed = _arbitrate(matched)
    return Decision(actions=applied, state=_advance(state, applied), suppressed=suppressed)


def _anomaly_start(anomaly_step: int, history: Sequence[Row], rule: Rule) -> int:
    """First step of the run of rows, ending at ``anomaly_step``, in which the condition may hold.

    Only a finite value that fails the condition proves a row healthy; a row without the metric or with
    a non-finite value is no evidence, so the walk goes past it (the conservative choice: an earlier
    checkpoint). drop_frac compares a row to its own past, so its anomaly is the last row alone.
    """
    if rule.condition == "drop_frac":
        return anomaly_step
    end = next((i for i in range(len(history) - 1, -1, -1) if _step(history[i]) == anomaly_step), None)
    start = anomaly_step
    for i in range(end if end is not None else -1, -1, -1):
        v = _value(history[i], rule.metric)
        if v is not None and math.isfinite(v) and not _holds(rule, v):
            break
        start = _step(history[i])
    return start


def rollback_target(committed_steps: Sequence[int], anomaly_step: int, history: Sequence[Row],
                    rule: Rule) -> int | None:
    """The newest committed checkpoint taken strictly before the anomaly began, or None.

    Rolling back to the step that triggered would keep the blow-up: a checkpoint at step s holds the
    state after step s, so the newest usable one is at most first_bad - 1. Pass the whole branch: a
    history that starts inside the anomaly makes its first row the start.
    """
    first_bad = _anomaly_start(anomaly_step, history, rule)
    return max((s for s in committed_steps if s < first_bad), default=None)


def unknown_metrics(rules: Iterable[Rule], columns: Iterable[str]) -> list[str]:
    """Metrics watched by a rule but absent from ``columns`` (a typo would leave the rule silent forever)."""
    known = set(columns)
    out: list[str] = []
    for rule in rules:
        if rule.metric not in known and rule.metric not in out:
            out.append(rule.metric)
    return out
