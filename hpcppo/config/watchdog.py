"""``[watchdog]`` section and its ``[[watchdog.rules]]``; the built-in rules follow the field-guide table."""

from __future__ import annotations

import math

import attrs

from hpcppo.config.fields import FieldValueError, did_you_mean, opt
from hpcppo import rule_actions
from hpcppo.errors import ConfigError
from hpcppo.rundir import metric_names as schema  # the trainer's column list (no numpy, no h5py)

__all__ = ["Rule", "WatchdogSection", "default_rules", "check_rule_metrics", "RULE_ACTIONS", "RULE_CONDITIONS"]

RULE_CONDITIONS = ("gt", "lt", "nonfinite", "drop_frac")
RULE_ACTIONS = rule_actions.NAMES


@attrs.frozen(kw_only=True)
class Rule:
    """One watchdog rule: when ``metric`` meets ``condition``, apply ``action``."""

    name: str = opt(help="Rule name, unique within the experiment; shown in events.jsonl.",
                    pattern=r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
    metric: str = opt(help="Metric column to watch, e.g. \"kl/actor_ref\", \"reward/mean\", \"actor/grad_norm\".",
                      pattern=r"[A-Za-z0-9_./-]+")
    condition: str = opt(choices=RULE_CONDITIONS,
                         help="gt/lt: value above/below threshold; nonfinite: NaN or inf; drop_frac: value fell "
                              "more than threshold (a fraction) below its mean over the last `window` steps.")
    threshold: float = opt(0.0, help="Threshold of the condition (a fraction in (0, 1) for drop_frac; unused for nonfinite).")
    window: int = opt(10, ge=1, help="Steps in the recent mean used by drop_frac.")
    action: str = opt(choices=RULE_ACTIONS,
                      help="raise_kl_coef, rollback (to the last good checkpoint, lr x lr_scale), pause (checkpoint, "
                           "stop, no requeue), set_grad_clip, restart_critic (from its last good weights), requeue.")
    factor: float = opt(1.5, gt=1.0, help="raise_kl_coef: multiply kl_coef by this factor.")
    min_value: float = opt(1e-4, gt=0.0, help="raise_kl_coef: lower clamp of kl_coef.")
    max_value: float = opt(10.0, gt=0.0, help="raise_kl_coef: upper clamp of kl_coef.")
    lr_scale: float = opt(0.5, gt=0.0, le=1.0, help="rollback: multiply the learning rates by this factor.")
    grad_clip: float = opt(1.0, gt=0.0, help="set_grad_clip: the new gradient-norm clip.")
    cooldown_steps: int = opt(10, ge=0, help="Steps after firing during which the rule stays quiet.")
    max_count: int = opt(3, ge=0, help="Times the rule may fire in a run; 0 = never fires (disabled). A rule whose "
                                       "action paused the run is re-armed (one firing less) when it is resumed.")

    def __attrs_post_init__(self) -> None:
        if self.condition in ("gt", "lt") and not math.isfinite(self.threshold):
            raise FieldValueError("threshold", f"{self.threshold} must be a finite number for condition {self.condition!r}")
        if self.condition == "drop_frac":
            if not 0.0 < self.threshold < 1.0:
                raise FieldValueError("threshold", f"{self.threshold} must be a fraction in (0, 1) for condition 'drop_frac'")
            if self.window < 2:
                raise FieldValueError("window", f"{self.window} must be >= 2 for condition 'drop_frac'")
        conditions = rule_actions.lookup(self.action).conditions
        if conditions is not None and self.condition not in conditions:
            needed = " or ".join(repr(c) for c in conditions)
            raise FieldValueError("condition", f"action {self.action!r} needs condition {needed}, not {self.condition!r}")
        if self.action == "raise_kl_coef" and self.min_value >= self.max_value:
            raise FieldValueError("min_value", f"{self.min_value} must be below max_value {self.max_value}")


def default_rules() -> list[Rule]:
    """The built-in rules (the table in the design document)."""
    return [
        Rule(name="kl_raise_coef", metric="kl/actor_ref", condition="gt", threshold=0.05, action="raise_kl_coef",
             factor=1.5, min_value=1e-4, max_value=10.0),
        Rule(name="kl_rollback", metric="kl/actor_ref", condition="gt", threshold=0.05, action="rollback",
             lr_scale=0.5),
        Rule(name="reward_drop_rollback", metric="reward/mean", condition="drop_frac", threshold=0.2, window=10,
             action="rollback", lr_scale=0.5),
        Rule(name="kl_pause", metric="kl/actor_ref", condition="gt", threshold=0.1, action="pause", max_count=1),
        Rule(name="grad_norm_clip", metric="actor/grad_norm", condition="gt", threshold=1e4, action="set_grad_clip",
             grad_clip=1.0),
        Rule(name="value_loss_nonfinite", metric="critic/vf_loss", condition="nonfinite", action="restart_critic"),
    ]


def _merge_rules(given: list[Rule], with_defaults: bool) -> list[Rule]:
    if not with_defaults:
        return list(given)
    names = {r.name for r in given}
    return [r for r in default_rules() if r.name not in names] + list(given)


@attrs.frozen(kw_only=True)
class WatchdogSection:
    """``[watchdog]``: the rules the trainer enforces at every step boundary, and the process beside the trainer
    that watches its heartbeat (hangs, dead trainers)."""

    enable: bool = opt(True, help="Enforce the rules in the trainer and run the heartbeat monitor beside it; "
                                  "false = neither.")
    interval_s: float = opt(30.0, gt=0.0, help="Seconds between two looks of the heartbeat monitor at the metrics log.")
    heartbeat_factor: float = opt(10.0, gt=1.0,
                                  help="No step for heartbeat_factor x the typical step time -> cancel and requeue.")
    min_heartbeat_s: float = opt(600.0, gt=0.0, help="Never declare a hang before this many seconds without a step.")
    defaults: bool = opt(True, help="Start from the built-in rules; a rule you list with the same name replaces one, "
                                    "others are added. false = only your rules.")
    rules: list[Rule] = opt(factory=list, help="The rules ([[watchdog.rules]] tables); after loading, the "
                                               "effective list (built-in ones included when defaults = true).")

    def __attrs_post_init__(self) -> None:
        # Store the effective list so every consumer sees the same rules. Idempotent: re-loading a
        # resolved.toml (defaults = true, all built-ins already present by name) yields the same list.
        merged = _merge_rules(self.rules, self.defaults)
        seen: set[str] = set()
        for rule in merged:
            if rule.name in seen:
                raise FieldValueError("rules", f"two rules are named {rule.name!r}; rule names must be unique")
            seen.add(rule.name)
        object.__setattr__(self, "rules", merged)


def check_rule_metrics(section: WatchdogSection, *, file: str | None = None, extra: tuple[str, ...] = ()) -> None:
    """A rule whose metric the trainer never logs would never fire: a typo must fail at compile time, not leave a
    run unprotected. ``extra``: the run's own columns (``rollout_corr/*`` with the rollout correction on). Raises
    ``ConfigError`` naming the rule, the metric and the closest column."""
    if not section.enable:
        return
    for rule in section.rules:
        if not schema.is_trainer_column(rule.metric) and rule.metric not in extra:
            known = [*schema.trainer_columns(), *extra]
            raise ConfigError(f"rule {rule.name!r}: metric {rule.metric!r} is not logged by the trainer"
                              f"{did_you_mean(rule.metric, known)}; metrics: {', '.join(known)}, "
                              f"{schema.VALIDATION_PREFIX}<data_source>[/<stat>@<k>], "
                              f"{schema.VALIDATION_ACC_PREFIX}<data_source>[/<stat>@<k>] (DAPO's overlong buffer)",
                              file=file, key="watchdog.rules")
