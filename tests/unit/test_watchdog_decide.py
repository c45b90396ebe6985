"""watchdog.decide: conditions, cooldown and max_count, precedence and suppression, state, rollback
targets, the KL coefficient helper, replay, and the light import of ``hpcppo.watchdog``."""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys

import attrs
import pytest

from hpcppo.config import Rule, default_rules
from hpcppo.config.watchdog import RULE_ACTIONS
from hpcppo.watchdog import PRECEDENCE, Action, Decision, WatchdogState, decide
from hpcppo.watchdog.decide import rollback_target, unknown_metrics
from hpcppo.watchdog.respond import raised_kl_coef
from hpcppo.watchdog.replay import format_replay, replay

NAN, INF = math.nan, math.inf


def rule(**kw: object) -> Rule:
    """A rule on metric "m" that may fire on every step unless the test says otherwise."""
    fields: dict[str, object] = {"name": "r", "metric": "m", "condition": "gt", "threshold": 1.0, "action": "pause",
                                 "cooldown_steps": 0, "max_count": 100}
    fields.update(kw)
    return Rule(**fields)  # type: ignore[arg-type]


def rows(values: list[float | None], metric: str = "m", first_step: int = 1) -> list[dict[str, float]]:
    """One row per value; None leaves the metric out of that row."""
    return [{"step": first_step + i, **({} if v is None else {metric: v})} for i, v in enumerate(values)]


def fires(rules: list[Rule], history: list[dict[str, float]], state: WatchdogState | None = None) -> list[str]:
    """Rule names applied on the last row of ``history``."""
    return [a.rule for a in decide(history, rules, state or WatchdogState()).actions]


def run(rules: list[Rule], history: list[dict[str, float]]) -> list[Decision]:
    """decide at every step, the state carried over, as the trainer does."""
    state, out = WatchdogState(), []
    for i in range(1, len(history) + 1):
        d = decide(history[:i], rules, state)
        state = d.state
        out.append(d)
    return out


def fired_steps(decisions: list[Decision], name: str = "r") -> list[int]:
    return [a.step for d in decisions for a in d.actions if a.rule == name]


# --- conditions ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [(1.5, True), (1.0, False), (0.5, False), (NAN, False), (INF, True),
                                             (-INF, False)])
def test_gt(value: float, expected: bool) -> None:
    assert fires([rule(condition="gt", threshold=1.0)], rows([0.0, value])) == (["r"] if expected else [])


@pytest.mark.parametrize("value, expected", [(0.5, True), (1.0, False), (1.5, False), (NAN, False), (-INF, True),
                                             (INF, False)])
def test_lt(value: float, expected: bool) -> None:
    assert fires([rule(condition="lt", threshold=1.0)], rows([2.0, value])) == (["r"] if expected else [])


@pytest.mark.parametrize("value, expected", [(NAN, True), (INF, True), (-INF, True), (0.0, False), (1e300, False)])
def test_nonfinite(value: float, expected: bool) -> None:
    assert fires([rule(condition="nonfinite", action="restart_critic")], rows([value])) == (["r"] if expected else [])


def drop(**kw: object) -> Rule:
    return rule(condition="drop_frac", threshold=0.2, window=3, action="rollback", **kw)


def test_drop_frac_needs_a_drop_below_the_full_window_mean() -> None:
    # mean of the previous 3 = 1.0; the limit is 0.8
    assert fires([drop()], rows([5.0, 1.0, 1.0, 1.0, 0.79])) == ["r"]   # 5.0 is outside the window
    assert fires([drop()], rows([5.0, 1.0, 1.0, 1.0, 0.8])) == []
    assert fires([drop()], rows([1.0, 1.0, 1.0, 1.2])) == []


def test_drop_frac_short_window_cannot_fire() -> None:
    assert fires([drop()], rows([1.0, 1.0, 0.0])) == []
    assert fires([drop()], rows([1.0, 1.0, 1.0, 0.0])) == ["r"]


def test_drop_frac_zero_mean_cannot_fire() -> None:
    assert fires([drop()], rows([1.0, -1.0, 0.0, -100.0])) == []


def test_drop_frac_negative_mean_uses_its_magnitude() -> None:
    # mean -1.0, limit -1.2
    assert fires([drop()], rows([-1.0, -1.0, -1.0, -1.21])) == ["r"]
    assert fires([drop()], rows([-1.0, -1.0, -1.0, -1.19])) == []


@pytest.mark.parametrize("value", [NAN, -INF, INF])
def test_drop_frac_nonfinite_value_does_not_fire(value: float) -> None:
    assert fires([drop()], rows([1.0, 1.0, 1.0, value])) == []


def test_drop_frac_skips_nonfinite_and_missing_values_in_the_window() -> None:
    # The window reaches past NaN, inf and a missing row to the 3 newest finite values: 1, 1, 1 (not 100).
    history = rows([100.0, 1.0, NAN, 1.0, None, INF, 1.0, 0.7])
    assert fires([drop()], history) == ["r"]
    action = decide(history, [drop()], WatchdogState()).actions[0]
    assert action.reason == "m=0.7 < 0.8 (20% below its 3-step mean 1)"
    # Only 2 finite values before the last row: the window is not full.
    assert fires([drop()], rows([NAN, 1.0, NAN, 1.0, 0.0])) == []


def test_missing_metric_or_none_does_not_fire() -> None:
    assert fires([rule(), rule(name="n", condition="nonfinite")], rows([5.0, None])) == []
    assert fires([rule()], [{"step": 1, "m": None}]) == []  # type: ignore[dict-item]
    assert decide([], [rule()], WatchdogState()).actions == ()


def test_row_without_step_is_an_error() -> None:
    with pytest.raises(ValueError, match="no 'step'"):
        decide([{"m": 5.0}], [rule()], WatchdogState())


def test_action_carries_value_step_reason_and_parameters() -> None:
    rules = [rule(name="kl", metric="kl/actor_ref", threshold=0.05, action="raise_kl_coef", factor=2.0,
                  min_value=0.01, max_value=1.0),
             rule(name="rb", metric="kl/actor_ref", threshold=0.05, action="rollback", lr_scale=0.25),
             rule(name="gc", metric="g", threshold=10.0, action="set_grad_clip", grad_clip=0.5),
             rule(name="vf", metric="v", condition="nonfinite", action="restart_critic")]
    history = [{"step": 7, "kl/actor_ref": 0.083, "g": 11.0, "v": 0.0}]
    d = decide(history, rules, WatchdogState())
    kl, rb, gc = d.action("raise_kl_coef"), d.rollback, d.action("set_grad_clip")
    assert (kl.value, kl.threshold, kl.step, kl.reason) == (0.083, 0.05, 7, "kl/actor_ref=0.083 > 0.05")
    assert (kl.factor, kl.min_value, kl.max_value, kl.lr_scale, kl.grad_clip) == (2.0, 0.01, 1.0, None, None)
    assert (rb.lr_scale, rb.factor, rb.grad_clip) == (0.25, None, None)
    assert (gc.grad_clip, gc.lr_scale, gc.reason) == (0.5, None, "g=11 > 10")
    nan_loss = decide([{"step": 2, "v": NAN}], rules, WatchdogState()).actions[0]
    assert (nan_loss.kind, nan_loss.reason) == ("restart_critic", "v=nan is not finite")
    assert math.isnan(nan_loss.value)
    lt = decide(rows([0.5]), [rule(condition="lt", threshold=0.75)], WatchdogState()).actions[0]
    assert lt.reason == "m=0.5 < 0.75"


# --- cooldown and max_count ---------------------------------------------------------------------------

def test_cooldown_boundaries() -> None:
    decisions = run([rule(cooldown_steps=3)], rows([5.0] * 10))
    # fires at 1, quiet 2..4, fires at 5 (= 1 + 3 + 1), quiet 6..8, fires at 9
    assert fired_steps(decisions) == [1, 5, 9]


def test_cooldown_zero_fires_every_step() -> None:
    assert fired_steps(run([rule(cooldown_steps=0)], rows([5.0] * 4))) == [1, 2, 3, 4]


def test_cooldown_window_is_in_step_numbers() -> None:
    state = WatchdogState(fired={"r": 1}, last_fired={"r": 10})
    cooled = [rule(cooldown_steps=5)]
    assert fires(cooled, rows([5.0], first_step=15), state) == []
    assert fires(cooled, rows([5.0], first_step=16), state) == ["r"]
    # A step at or before the firing step only comes back on the branch retried after a rollback.
    assert fires(cooled, rows([5.0], first_step=8), state) == ["r"]
    assert fires(cooled, rows([5.0], first_step=10), state) == ["r"]


def test_max_count_and_zero_disables() -> None:
    assert fired_steps(run([rule(max_count=2)], rows([5.0] * 6))) == [1, 2]
    assert fired_steps(run([rule(max_count=0)], rows([5.0] * 6))) == []
    assert fires([rule(max_count=3)], rows([5.0]), WatchdogState(fired={"r": 3})) == []


def test_quiet_step_keeps_the_state_object() -> None:
    state = WatchdogState(fired={"r": 1}, last_fired={"r": 1})
    assert decide(rows([0.0]), [rule()], state).state is state


# --- precedence and suppression -----------------------------------------------------------------------

ALL = [rule(name="clip", action="set_grad_clip", grad_clip=2.0),
       rule(name="kl", action="raise_kl_coef"),
       rule(name="critic", action="restart_critic"),
       rule(name="rb", action="rollback"),
       rule(name="requeue", action="requeue"),
       rule(name="pause", action="pause")]


def names(actions: tuple[Action, ...]) -> list[str]:
    return [a.rule for a in actions]


def test_precedence_covers_every_action() -> None:
    assert sorted(PRECEDENCE) == sorted(RULE_ACTIONS)


def test_pause_beats_everything() -> None:
    d = decide(rows([5.0]), ALL, WatchdogState())
    assert names(d.actions) == ["pause"] and d.stops and d.rollback is None
    assert names(d.suppressed) == ["requeue", "rb", "critic", "kl", "clip"]
    assert d.state.fired == {"pause": 1} and d.state.last_fired == {"pause": 1}
    assert d.state.lr_scale == 1.0 and d.state.grad_clip is None
    assert all(d.superseded_by(a).rule == "pause" for a in d.suppressed)


def test_requeue_beats_everything_but_pause() -> None:
    d = decide(rows([5.0]), ALL[:5], WatchdogState())
    assert names(d.actions) == ["requeue"] and d.stops
    assert names(d.suppressed) == ["rb", "critic", "kl", "clip"]
    assert d.state.fired == {"requeue": 1}


def test_rollback_suppresses_restart_critic_only() -> None:
    d = decide(rows([5.0]), ALL[:4], WatchdogState())
    assert names(d.actions) == ["rb", "kl", "clip"] and not d.stops
    assert names(d.suppressed) == ["critic"] and d.superseded_by(d.suppressed[0]).rule == "rb"
    assert d.state.fired == {"rb": 1, "kl": 1, "clip": 1}
    assert (d.state.lr_scale, d.state.grad_clip) == (0.5, 2.0)


def test_restart_critic_applies_without_a_rollback() -> None:
    d = decide(rows([5.0]), ALL[:3], WatchdogState())
    assert names(d.actions) == ["critic", "kl", "clip"] and d.suppressed == ()


def test_suppressed_rules_keep_their_count_and_cooldown() -> None:
    rules = [rule(name="critic", action="restart_critic", cooldown_steps=10, max_count=1),
             rule(name="rb", metric="k", action="rollback", cooldown_steps=10)]
    first = decide([{"step": 1, "m": 5.0, "k": 5.0}], rules, WatchdogState())
    assert names(first.suppressed) == ["critic"] and "critic" not in first.state.fired
    second = decide([{"step": 2, "m": 5.0, "k": 0.0}], rules, first.state)
    assert names(second.actions) == ["critic"]


def test_duplicate_actions_first_rule_wins() -> None:
    rules = [rule(name="rb1", action="rollback", lr_scale=0.5), rule(name="rb2", action="rollback", lr_scale=0.1),
             rule(name="p1", action="pause"), rule(name="p2", action="pause")]
    d = decide(rows([5.0]), rules[:2], WatchdogState())
    assert names(d.actions) == ["rb1"] and names(d.suppressed) == ["rb2"]
    assert d.state.lr_scale == 0.5 and d.state.fired == {"rb1": 1}
    assert d.superseded_by(d.suppressed[0]).rule == "rb1"
    d = decide(rows([5.0]), rules[::-1], WatchdogState())
    assert names(d.actions) == ["p2"] and names(d.suppressed) == ["p1", "rb2", "rb1"]


def test_duplicate_grad_clips_the_tightest_wins_first_on_ties() -> None:
    rules = [rule(name="loose", action="set_grad_clip", grad_clip=5.0),
             rule(name="tight", action="set_grad_clip", grad_clip=0.5),
             rule(name="tight2", action="set_grad_clip", grad_clip=0.5)]
    d = decide(rows([5.0]), rules, WatchdogState())
    assert names(d.actions) == ["tight"] and names(d.suppressed) == ["loose", "tight2"]
    assert d.state.grad_clip == 0.5


def test_lr_scale_composes_over_two_rollbacks() -> None:
    rules = [rule(name="a", action="rollback", lr_scale=0.5, max_count=1),
             rule(name="b", metric="k", action="rollback", lr_scale=0.2)]
    d1 = decide([{"step": 1, "m": 5.0}], rules, WatchdogState())
    d2 = decide([{"step": 2, "k": 5.0}], rules, d1.state)
    assert (d1.state.lr_scale, d2.state.lr_scale) == (0.5, pytest.approx(0.1))
    assert d2.rollback.lr_scale == 0.2


def test_grad_clip_only_tightens_over_steps() -> None:
    rules = [rule(name="tight", metric="a", action="set_grad_clip", grad_clip=1.0),
             rule(name="loose", metric="b", action="set_grad_clip", grad_clip=4.0)]
    s1 = decide([{"step": 1, "b": 5.0}], rules, WatchdogState()).state
    s2 = decide([{"step": 2, "a": 5.0}], rules, s1).state
    s3 = decide([{"step": 3, "b": 5.0}], rules, s2).state
    assert (s1.grad_clip, s2.grad_clip, s3.grad_clip) == (4.0, 1.0, 1.0)
    assert s3.fired == {"loose": 2, "tight": 1}


# --- state ----------------------------------------------------------------------------------------------

FULL = WatchdogState(fired={"kl_rollback": 2, "kl_pause": 1}, last_fired={"kl_rollback": 40, "kl_pause": 12},
                     lr_scale=0.25, grad_clip=1.0)


def test_state_round_trips_through_dict_json_and_pickle() -> None:
    d = FULL.to_dict()
    assert WatchdogState.from_dict(d) == FULL
    assert WatchdogState.from_dict(json.loads(json.dumps(d))) == FULL
    assert pickle.loads(pickle.dumps(FULL)) == FULL
    assert WatchdogState.from_dict(WatchdogState().to_dict()) == WatchdogState() == WatchdogState.from_dict({})


def test_state_dict_holds_only_plain_types() -> None:
    def plain(x: object) -> bool:
        if isinstance(x, dict):
            return all(isinstance(k, str) and plain(v) for k, v in x.items())
        return x is None or type(x) in (str, int, float)
    assert plain(FULL.to_dict()) and plain(WatchdogState().to_dict())
    assert plain(decide(rows([5.0]), ALL[:4], WatchdogState()).state.to_dict())


def test_state_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match=r"unknown watchdog state key\(s\) \['counts'\]"):
        WatchdogState.from_dict({"counts": {}})


def test_state_is_immutable_and_decide_does_not_touch_it() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        FULL.lr_scale = 1.0  # type: ignore[misc]
    before = FULL.to_dict()
    d = decide(rows([5.0], first_step=100), [rule(name="kl_rollback", action="rollback")], FULL)
    assert FULL.to_dict() == before
    assert d.state.fired["kl_rollback"] == 3 and d.state.lr_scale == 0.125
    assert d.state.fired is not FULL.fired


def test_state_from_dict_reads_an_old_state_with_its_kl_coef() -> None:
    # Checkpoints written while the watchdog's state kept a copy of the coefficient: the key is read and dropped
    # (the coefficient's one holder is the training state, restored from the checkpoint's kl_ctrl entry).
    old = FULL.to_dict() | {"kl_coef": 0.3}
    assert WatchdogState.from_dict(old) == FULL and "kl_coef" not in FULL.to_dict()
    assert WatchdogState.from_dict({"kl_coef": None}) == WatchdogState()


def test_decision_to_dict_is_json() -> None:
    d = decide(rows([5.0]), ALL[:4], WatchdogState())
    back = json.loads(json.dumps(d.to_dict()))
    assert [a["rule"] for a in back["actions"]] == ["rb", "kl", "clip"]
    assert back["suppressed"][0]["kind"] == "restart_critic" and back["state"]["lr_scale"] == 0.5
    assert back["actions"][0] == {"kind": "rollback", "rule": "rb", "metric": "m", "value": 5.0, "threshold": 1.0,
                                  "step": 1, "reason": "m=5 > 1", "factor": None, "min_value": None,
                                  "max_value": None, "lr_scale": 0.5, "grad_clip": None}


# --- the built-in rules on a KL trajectory --------------------------------------------------------------

def test_default_rules_on_a_kl_trajectory() -> None:
    kl = [0.01, 0.03, 0.06, 0.12] + [0.04] * 9 + [0.07, 0.2, 0.01]
    history = [{"step": i + 1, "kl/actor_ref": k, "reward/mean": 1.0, "actor/grad_norm": 1.0, "critic/vf_loss": 0.1}
               for i, k in enumerate(kl)]
    decisions = run(default_rules(), history)
    applied = {i + 1: names(d.actions) for i, d in enumerate(decisions) if d.actions}
    assert applied == {3: ["kl_rollback", "kl_raise_coef"],   # KL > 0.05
                       4: ["kl_pause"],                       # > 0.1; the other KL rules cool down until 13
                       14: ["kl_rollback", "kl_raise_coef"]}  # cooled down; kl_pause (max 1) is spent at 15
    assert all(d.suppressed == () for d in decisions)
    assert decisions[-1].state.lr_scale == 0.25
    assert decisions[-1].state.fired == {"kl_rollback": 2, "kl_raise_coef": 2, "kl_pause": 1}


def test_default_rules_jump_to_pause_suppresses_the_rest() -> None:
    history = [{"step": 1, "kl/actor_ref": 0.12, "actor/grad_norm": 2e4, "critic/vf_loss": NAN}]
    d = decide(history, default_rules(), WatchdogState())
    assert names(d.actions) == ["kl_pause"]
    assert names(d.suppressed) == ["kl_rollback", "value_loss_nonfinite", "kl_raise_coef", "grad_norm_clip"]


def test_unknown_metrics() -> None:
    columns = ["kl/actor_ref", "reward/mean", "actor/grad_norm"]
    assert unknown_metrics(default_rules(), columns) == ["critic/vf_loss"]
    assert unknown_metrics(default_rules() + [rule(name="x", metric="kl/actor-ref")], columns) == [
        "critic/vf_loss", "kl/actor-ref"]
    assert unknown_metrics(default_rules(), columns + ["critic/vf_loss"]) == []


# --- rollback target and the KL coefficient -------------------------------------------------------------

def test_rollback_target_walks_back_over_the_anomaly() -> None:
    r = rule(threshold=0.05, action="rollback")
    history = rows([0.01, 0.02, 0.06, 0.07, 0.09])   # anomaly began at step 3
    assert rollback_target([0, 2, 3, 4, 5], 5, history, r) == 2
    assert rollback_target([0, 1, 3, 4], 5, history, r) == 1
    assert rollback_target([3, 4, 5], 5, history, r) is None  # no checkpoint before the anomaly


def test_rollback_target_excludes_the_anomalous_step() -> None:
    r = rule(threshold=0.05, action="rollback")
    history = rows([0.01, 0.02, 0.06])
    assert rollback_target([2, 3], 3, history, r) == 2
    assert rollback_target([3], 3, history, r) is None
    assert rollback_target([], 3, history, r) is None


def test_rollback_target_unknown_rows_are_no_evidence_of_health() -> None:
    r = rule(threshold=0.05, action="rollback")
    # step 3 lacks the metric and step 4 is NaN: the anomaly may have begun right after step 2.
    history = rows([0.01, 0.02, None, NAN, 0.08])
    assert rollback_target([1, 2, 3, 4], 5, history, r) == 2
    # A history that starts inside the anomaly: its first row is the start.
    assert rollback_target([0, 1], 5, rows([0.1, 0.2, 0.3], first_step=3), r) == 1


def test_rollback_target_nonfinite_and_drop_frac() -> None:
    nf = rule(metric="v", condition="nonfinite", action="rollback")
    assert rollback_target([1, 2, 3], 4, rows([0.1, 0.1, NAN, INF], metric="v"), nf) == 2
    dr = drop()
    assert rollback_target([1, 2, 3], 4, rows([1.0, 0.1, 0.1, 0.1]), dr) == 3   # the last row only


def test_rollback_target_uses_the_row_of_the_anomaly_step() -> None:
    r = rule(threshold=0.05, action="rollback")
    history = rows([0.01, 0.06, 0.07, 0.01])
    assert rollback_target([0, 1, 2], 3, history, r) == 1
    assert rollback_target([0, 1, 2, 3], 9, history, r) == 3   # step not in the history: starts at itself


def test_raised_kl_coef_clamps_both_ways() -> None:
    a = decide(rows([5.0]), [rule(action="raise_kl_coef", factor=2.0, min_value=0.01, max_value=1.0)],
               WatchdogState()).actions[0]
    assert raised_kl_coef(0.1, a) == 0.2
    assert raised_kl_coef(0.8, a) == 1.0
    assert raised_kl_coef(0.001, a) == 0.01
    assert raised_kl_coef(0.0, a) == 0.01
    with pytest.raises(ValueError, match="needs a raise_kl_coef action, got 'pause'"):
        raised_kl_coef(0.1, decide(rows([5.0]), [rule()], WatchdogState()).actions[0])
    with pytest.raises(ValueError, match="finite"):
        raised_kl_coef(NAN, a)


# --- replay ----------------------------------------------------------------------------------------------

def test_replay_and_format() -> None:
    kl = [0.01, 0.02, 0.083, 0.04, 0.04, 0.07, 0.2]
    history = [{"step": 10 + i, "kl/actor_ref": k, "reward/mean": 1.0} for i, k in enumerate(kl)]
    rules = [rule(name="kl_rollback", metric="kl/actor_ref", threshold=0.05, action="rollback", lr_scale=0.5),
             rule(name="kl_pause", metric="kl/actor_ref", threshold=0.1, action="pause", max_count=1)]
    results = replay(history, rules)
    assert [step for step, _ in results] == [12, 15, 16]
    assert results[1][1].state.lr_scale == 0.25          # the rollback does not stop the replay
    assert format_replay(results) == [
        "step 12  kl_rollback        rollback      kl/actor_ref=0.083 > 0.05  (lr x0.5, total x0.5)",
        "step 15  kl_rollback        rollback      kl/actor_ref=0.07 > 0.05  (lr x0.5, total x0.25)",
        "step 16  kl_pause           pause         kl/actor_ref=0.2 > 0.1  (checkpoint and stop, no requeue)",
        "step 16  kl_rollback        rollback      kl/actor_ref=0.2 > 0.05  (suppressed by pause (kl_pause))",
    ]
    assert replay([], rules) == [] and format_replay([]) == []


def test_format_replay_effects_of_each_kind() -> None:
    rules = [rule(name="kl", action="raise_kl_coef", factor=1.5, min_value=1e-4, max_value=10.0),
             rule(name="clip", action="set_grad_clip", grad_clip=1.0),
             rule(name="critic", metric="v", condition="nonfinite", action="restart_critic"),
             rule(name="rq", metric="q", action="requeue")]
    lines = format_replay(replay([{"step": 1, "m": 2.0, "v": INF}, {"step": 2, "q": 2.0}], rules))
    assert [line.split("  (")[-1] for line in lines] == [
        "critic from its last good weights)", "kl_coef x1.5, within [0.0001, 10])", "grad clip 1, now 1)",
        "stop and requeue)"]


def test_replay_window_keep_trims_the_history() -> None:
    # A NaN inside the window: the whole prefix reaches past it, a trimmed history of window + 1 rows does not.
    history = rows([1.0, 1.0, 1.0, NAN, 1.0, 0.5])
    assert [s for s, _ in replay(history, [drop()])] == [6]
    assert replay(history, [drop()], window_keep=4) == []
    assert [s for s, _ in replay(history, [drop()], window_keep=5)] == [6]
    with pytest.raises(ValueError, match="window_keep must be >= 1"):
        replay(history, [drop()], window_keep=0)


# --- light import -----------------------------------------------------------------------------------------

def test_import_loads_no_heavy_module() -> None:
    code = ("import sys, hpcppo.watchdog, hpcppo.watchdog.replay\n"
            "print(sorted(m for m in ('torch', 'numpy', 'h5py', 'pandas') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
