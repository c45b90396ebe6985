"""How a decision is carried out (``hpcppo.watchdog.respond``) and the training state's transitions, with no model:
a recording stand-in for the trainer's hands keeps every call."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest

from hpcppo import rule_actions
from hpcppo.config.watchdog import Rule
from hpcppo.watchdog import TrainingState, WatchdogState, decide, history_keep, respond
from hpcppo.watchdog.respond import TRANSITIONS

KL_ROLLBACK = Rule(name="kl_rollback", metric="kl", condition="gt", threshold=0.05, action="rollback", lr_scale=0.5)
KL_RAISE = Rule(name="kl_raise", metric="kl", condition="gt", threshold=0.05, action="raise_kl_coef", factor=2.0,
                min_value=1e-4, max_value=1.0)
VF_NAN = Rule(name="vf_nan", metric="vf", condition="nonfinite", action="restart_critic")


class RecordingHands:
    """Stand-in for the trainer's :class:`~hpcppo.train.recovery.Recovery`: records calls; a rollback "restores" the
    KL coefficient ``restored_kl``."""

    def __init__(self, committed: Sequence[int], restored_kl: float = 0.02):
        self._committed = list(committed)
        self.restored_kl = restored_kl
        self.calls: list[tuple[Any, ...]] = []

    def committed(self) -> list[int]:
        return self._committed

    def roll_back(self, state: TrainingState, target: int, *, lr_factor: float | None = None) -> TrainingState:
        self.calls.append(("roll_back", target, lr_factor))
        return state.rolled_back(target, kl_coef=self.restored_kl, lr_factor=lr_factor)

    def restart_critic(self, target: int) -> None:
        self.calls.append(("restart_critic", target))

    def stop(self, state: TrainingState, kind: str, reason: str) -> int:
        self.calls.append(("stop", state.step, kind, reason))
        return 76 if kind == "pause" else 75

    def record(self, step: int, kind: str, message: str, **details: Any) -> None:
        self.calls.append(("record", step, kind))


def judged(rows: list[dict[str, float]], rules: list[Rule], kl_coef: float = 0.1) -> tuple[TrainingState, Any]:
    """The state after the trainer judged ``rows`` (steps 1..n) and the decision on the last one."""
    state = TrainingState(kl_coef=kl_coef)
    for row in rows:
        state = state.next_step().with_row(row, history_keep(rules))
    decision = decide(state.history, rules, state.watchdog)
    return TrainingState(step=state.step, kl_coef=kl_coef, watchdog=decision.state, history=state.history), decision


def test_rollback_then_raise_raises_the_restored_coefficient() -> None:
    rows = [{"kl": 0.01}, {"kl": 0.01}, {"kl": 0.01}, {"kl": 0.3}]
    state, decision = judged(rows, [KL_ROLLBACK, KL_RAISE])
    hands = RecordingHands([1, 2, 4])
    out = respond(decision, state, hands, {"kl_rollback": KL_ROLLBACK, "kl_raise": KL_RAISE}, grad_clips={})
    assert out.exit_code is None
    assert ("roll_back", 2, None) in hands.calls  # step 4's checkpoint is inside the anomaly; 3 was never committed
    assert out.state.kl_coef == pytest.approx(0.04)  # 0.02 restored, x2: not the 0.1 of before the rollback
    assert (out.state.step, out.state.branch, out.state.lr_scale) == (2, 1, 0.5)
    assert [c[2] for c in hands.calls if c[0] == "record"] == ["watchdog.rollback", "watchdog.raise_kl_coef"]
    assert all(c[1] == 4 for c in hands.calls if c[0] == "record")  # dated by the step judged, not the target


def test_no_checkpoint_before_the_anomaly_pauses_undoes_the_lr_cut_and_supersedes_the_rest() -> None:
    state, decision = judged([{"kl": 0.3}], [KL_ROLLBACK, KL_RAISE])
    assert state.lr_scale == 0.5  # the decision's state already counts the rollback
    hands = RecordingHands([])
    out = respond(decision, state, hands, {"kl_rollback": KL_ROLLBACK, "kl_raise": KL_RAISE}, grad_clips={})
    assert out.exit_code == 76 and out.state.lr_scale == 1.0 and out.state.kl_coef == 0.1
    assert [c for c in hands.calls if c[0] != "record"] == [("stop", 1, "pause", hands.calls[-1][3])]
    assert [c[2] for c in hands.calls if c[0] == "record"] == ["watchdog.pause", "watchdog.suppressed"]


def test_restart_critic_leaves_the_state_alone() -> None:
    state, decision = judged([{"vf": 1.0}, {"vf": math.inf}], [VF_NAN])
    hands = RecordingHands([1])
    out = respond(decision, state, hands, {"vf_nan": VF_NAN}, grad_clips={})
    assert ("restart_critic", 1) in hands.calls and out.state == state


def test_a_stop_wins_and_says_which_rule() -> None:
    pause = Rule(name="p", metric="kl", condition="gt", threshold=0.1, action="pause")
    state, decision = judged([{"kl": 0.3}], [KL_ROLLBACK, pause])
    hands = RecordingHands([])
    out = respond(decision, state, hands, {"kl_rollback": KL_ROLLBACK, "p": pause}, grad_clips={})
    assert out.exit_code == 76 and hands.calls[-1][:3] == ("stop", 1, "pause")
    assert "watchdog rule p: kl=0.3 > 0.1" == hands.calls[-1][3]
    assert [c[2] for c in hands.calls if c[0] == "record"] == ["watchdog.suppressed", "watchdog.pause"]


def test_training_state_transitions() -> None:
    s = TrainingState(kl_coef=0.1)
    for step in range(1, 8):
        s = s.next_step().with_row({"x": float(step)}, keep=5)
    assert [r["step"] for r in s.history] == [3.0, 4.0, 5.0, 6.0, 7.0]
    back = s.compose_lr_scale(0.5).rolled_back(4, kl_coef=0.3, lr_factor=0.5)
    assert (back.step, back.branch, back.actor_version, back.kl_coef, back.lr_scale) == (4, 1, 1, 0.3, 0.25)
    assert [r["step"] for r in back.history] == [3.0, 4.0]
    assert TrainingState(kl_coef=1.0, watchdog=WatchdogState(grad_clip=0.5)).grad_clip(1.0) == 0.5
    assert TrainingState(kl_coef=1.0, watchdog=WatchdogState(grad_clip=5.0)).grad_clip(1.0) == 1.0
    again = TrainingState.from_checkpoint(back.to_checkpoint(), kl_coef=0.3, actor_version=9)
    assert again == TrainingState(step=4, branch=1, actor_version=9, kl_coef=0.3, watchdog=back.watchdog,
                                  history=back.history)
    # A checkpoint from before the watchdog kept state resumes with a fresh one.
    assert TrainingState.from_checkpoint({"step": 3}, kl_coef=0.1, actor_version=1).watchdog == WatchdogState()


def test_every_action_of_the_table_has_its_transition_here() -> None:
    assert set(TRANSITIONS) == set(rule_actions.TRANSITIONS)
    assert {a.transition for a in rule_actions.ACTIONS} <= set(rule_actions.TRANSITIONS)
    assert sorted(a.precedence for a in rule_actions.ACTIONS) == list(range(len(rule_actions.ACTIONS)))
    assert rule_actions.STOPS == ("pause", "requeue")
    with pytest.raises(ValueError, match="unknown watchdog action 'reboot'; known: raise_kl_coef, rollback, pause"):
        rule_actions.lookup("reboot")
