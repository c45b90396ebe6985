"""How each watchdog action is carried out: the rules' :class:`~hpcppo.watchdog.Decision` applied to the training state.

The trainer calls :func:`respond` at the step boundary, after the step's row is logged, on every rank alike (rank 0
decided, the decision was broadcast). What "KL spiked" leads to reads top to bottom here: each action's transition
(its column in the actions' table, :mod:`hpcppo.rule_actions`) is one function below, in :data:`TRANSITIONS`:

======================  =============================================================================================
transition              what happens
======================  =============================================================================================
``stop``                the run checkpoints and stops (``pause``: exit 76, waits for ``hpcppo resume``; ``requeue``:
                        exit 75, requeued)
``roll_back``           back to the newest committed checkpoint from before the anomaly began: models, optimizers,
                        schedules and KL coefficient as they were there; new sampling branch; lr x the rule's
                        ``lr_scale`` (already in the decision's state); the checkpoint saved again
``restart_critic``      the critic's weights and optimizer from that checkpoint; the actor is untouched
``raise_kl_coef``       KL coefficient x ``factor``, clamped to ``[min_value, max_value]``
``set_grad_clip``       the tighter clip (already in the decision's state) applies from the next update
======================  =============================================================================================

A rollback or critic restart with no committed checkpoint from before the anomaly pauses the run instead (and the
rollback's lr cut is undone: no rollback happened). Every applied or suppressed action is recorded as an event.

The state transitions are pure (:class:`~hpcppo.watchdog.state.TrainingState` in, a new one out); what touches models
and files goes through :class:`Hands`, the interface the trainer lends the watchdog, declared here rather than
assumed. Tests drive :func:`respond` with a recording :class:`Hands` and no model at all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from hpcppo import rule_actions
from hpcppo.rundir import events
from hpcppo.watchdog.decide import Action, Decision, rollback_target
from hpcppo.watchdog.state import TrainingState

__all__ = ["Hands", "Outcome", "describe", "raised_kl_coef", "respond"]

_SUPPRESSED = events.watchdog_kind(events.SUPPRESSED)


class Hands(Protocol):
    """What the trainer lends the watchdog: the only ways a decision reaches models, checkpoints and the audit trail.
    Every method is called on every rank alike."""

    def committed(self) -> Sequence[int]:
        """The committed checkpoints' steps, oldest first."""
        ...

    def roll_back(self, state: TrainingState, target: int, *, lr_factor: float | None = None) -> TrainingState:
        """Restore everything from checkpoint ``target`` and return :meth:`TrainingState.rolled_back`'s state."""
        ...

    def restart_critic(self, target: int) -> None:
        """Restore the critic and its optimizer from checkpoint ``target``."""
        ...

    def stop(self, state: TrainingState, kind: str, reason: str) -> int:
        """Checkpoint and stop (``pause`` or ``requeue``); returns the job's exit code."""
        ...

    def record(self, step: int, kind: str, message: str, **details: Any) -> None:
        """One event in the run's audit trail."""
        ...


@attrs.frozen
class Outcome:
    """The state after the decision, and the exit code when the run stops (None: it goes on)."""

    state: TrainingState
    exit_code: int | None = None


def describe(action: Action) -> dict[str, Any]:
    """The fields of an action worth keeping in an event."""
    return {k: v for k, v in action.to_dict().items() if v is not None and k not in ("kind", "step")}


def raised_kl_coef(current: float, action: Action) -> float:
    """The kl_coef after a raise_kl_coef action: current x factor, clamped to [min_value, max_value]."""
    if action.kind != "raise_kl_coef" or action.factor is None or action.min_value is None or action.max_value is None:
        raise ValueError(f"raised_kl_coef needs a raise_kl_coef action, got {action.kind!r} from rule {action.rule!r}")
    if not math.isfinite(current):
        raise ValueError(f"the current kl_coef must be a finite number, got {current}")
    return min(max(current * action.factor, action.min_value), action.max_value)


def raise_kl(state: TrainingState, action: Action) -> TrainingState:
    """A raise_kl_coef action on the state."""
    return state.with_kl_coef(raised_kl_coef(state.kl_coef, action))


@attrs.frozen
class _Step:
    """One action being carried out: what every transition may need."""

    decision: Decision
    index: int  # the action's place in decision.actions
    judged: int  # the step the rules judged: every event is dated by it, even after a rollback moved the state's
    hands: Hands
    rules: Mapping[str, Any]
    grad_clips: Mapping[str, float]

    @property
    def action(self) -> Action:
        return self.decision.actions[self.index]

    def record(self, message: str, **details: Any) -> None:
        self.hands.record(self.judged, rule_actions.lookup(self.action.kind).event_kind, message,
                          **details, **describe(self.action))


def _stop(s: _Step, state: TrainingState) -> TrainingState | Outcome:
    action = s.action
    s.record(f"{action.rule}: {action.reason}")
    if action.kind == "pause":  # saved with the pause's checkpoint: a person's resume re-arms the rule
        state = attrs.evolve(state, watchdog=state.watchdog.paused(action.rule))
    return Outcome(state, s.hands.stop(state, action.kind, f"watchdog rule {action.rule}: {action.reason}"))


def _target(s: _Step, state: TrainingState) -> int | Outcome:
    """The checkpoint a rollback or critic restart goes back to, or the pause when there is none."""
    action = s.action
    committed = list(s.hands.committed())
    target = rollback_target(committed, action.step, state.history, s.rules[action.rule])
    if target is None:
        return _pause_without_target(s.decision.actions[s.index:], state, s.hands, s.judged, committed)
    s.record(f"{action.rule}: {action.reason}; back to checkpoint step {target}", checkpoint=target)
    return target


def _roll_back(s: _Step, state: TrainingState) -> TrainingState | Outcome:
    target = _target(s, state)
    return target if isinstance(target, Outcome) else s.hands.roll_back(state, target)


def _restart_critic(s: _Step, state: TrainingState) -> TrainingState | Outcome:
    target = _target(s, state)
    if isinstance(target, Outcome):
        return target
    s.hands.restart_critic(target)
    return state


def _raise_kl_coef(s: _Step, state: TrainingState) -> TrainingState | Outcome:
    old = state.kl_coef
    state = raise_kl(state, s.action)
    s.record(f"{s.action.rule}: {s.action.reason}; kl_coef {old:.4g} -> {state.kl_coef:.4g}", old=old,
             new=state.kl_coef)
    return state


def _set_grad_clip(s: _Step, state: TrainingState) -> TrainingState | Outcome:
    clips = ", ".join(f"{state.grad_clip(clip):.4g} ({name})" for name, clip in s.grad_clips.items())
    s.record(f"{s.action.rule}: {s.action.reason}; grad clip {clips}")
    return state


#: One function per transition of the actions' table (``rule_actions.TRANSITIONS``): the state after the action,
#: or the :class:`Outcome` that ends the decision (the run stops).
TRANSITIONS: dict[str, Callable[[_Step, TrainingState], TrainingState | Outcome]] = {
    "stop": _stop, "roll_back": _roll_back, "restart_critic": _restart_critic, "raise_kl_coef": _raise_kl_coef,
    "set_grad_clip": _set_grad_clip,
}


def respond(decision: Decision, state: TrainingState, hands: Hands, rules: Mapping[str, Any], *,
            grad_clips: Mapping[str, float]) -> Outcome:
    """Carry out ``decision`` (judged on ``state.step``, with ``decision.state`` already in ``state.watchdog``) in
    precedence order; ``rules`` by name, for the anomaly's start; ``grad_clips`` the configured clips by model, for
    the events. Events are dated by the step judged, even after a rollback has moved the state's step back."""
    judged = state.step
    for action in decision.suppressed:
        winner = decision.superseded_by(action)
        hands.record(judged, _SUPPRESSED, f"{action.rule}: {action.reason} (superseded by "
                     f"{winner.kind if winner else '?'})", **describe(action))
    for i, action in enumerate(decision.actions):
        transition = TRANSITIONS[rule_actions.lookup(action.kind).transition]
        after = transition(_Step(decision, i, judged, hands, rules, grad_clips), state)
        if isinstance(after, Outcome):
            return after
        state = after
    return Outcome(state)


def _pause_without_target(actions: Sequence[Action], state: TrainingState, hands: Hands, judged: int,
                          committed: Sequence[int]) -> Outcome:
    """``actions[0]`` (a rollback or critic restart) has no checkpoint to go back to: pause for a human instead, and
    record the actions after it as superseded by that pause."""
    action = actions[0]
    reason = (f"watchdog rule {action.rule} ({action.reason}) asked for {action.kind} but no committed checkpoint "
              f"predates the anomaly; committed: {list(committed) or 'none'}")
    hands.record(judged, events.watchdog_kind("pause"), reason, **describe(action))
    if action.kind == "rollback" and action.lr_scale is not None:
        state = state.compose_lr_scale(1.0 / action.lr_scale)  # no rollback happened: no lr cut either
    for rest in actions[1:]:
        hands.record(judged, _SUPPRESSED, f"{rest.rule}: {rest.reason} (superseded by the pause)", **describe(rest))
    state = attrs.evolve(state, watchdog=state.watchdog.paused(action.rule))
    return Outcome(state, hands.stop(state, "pause", reason))
