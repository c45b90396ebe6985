"""[watchdog] rules: built-in defaults, replacement by name, defaults = false, invalid combinations."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcppo.config import Rule, WatchdogSection, default_rules, load_experiment
from hpcppo.errors import ConfigError

BASE = 'name = "w"\n[model]\npath = "m"\n[data]\ntrain_files = ["t.parquet"]\n'


def rule_toml(**kw: object) -> str:
    fields = {"name": "mine", "metric": "kl/actor_ref", "condition": "gt", "threshold": 0.2, "action": "pause"}
    fields.update(kw)
    body = "\n".join(f"{k} = {v!r}".replace("'", '"') if isinstance(v, str) else f"{k} = {v}" for k, v in fields.items())
    return f"[[watchdog.rules]]\n{body}\n"


def load(tmp_path: Path, extra: str):
    p = tmp_path / "exp.toml"
    p.write_text(BASE + extra)
    return load_experiment(p)


def test_default_rules_follow_the_table():
    rules = {r.name: r for r in default_rules()}
    kl = rules["kl_raise_coef"]
    assert (kl.metric, kl.condition, kl.threshold, kl.action, kl.factor, kl.min_value, kl.max_value) == (
        "kl/actor_ref", "gt", 0.05, "raise_kl_coef", 1.5, 1e-4, 10.0)
    assert (rules["kl_rollback"].threshold, rules["kl_rollback"].action, rules["kl_rollback"].lr_scale) == (0.05, "rollback", 0.5)
    drop = rules["reward_drop_rollback"]
    assert (drop.metric, drop.condition, drop.threshold, drop.window, drop.action) == ("reward/mean", "drop_frac", 0.2, 10, "rollback")
    assert (rules["kl_pause"].threshold, rules["kl_pause"].action) == (0.1, "pause")
    assert (rules["grad_norm_clip"].metric, rules["grad_norm_clip"].threshold, rules["grad_norm_clip"].grad_clip) == (
        "actor/grad_norm", 1e4, 1.0)
    assert (rules["value_loss_nonfinite"].metric, rules["value_loss_nonfinite"].condition,
            rules["value_loss_nonfinite"].action) == ("critic/vf_loss", "nonfinite", "restart_critic")
    assert WatchdogSection().rules == default_rules()


def test_user_rules_replace_by_name_and_add(tmp_path):
    exp = load(tmp_path, rule_toml(name="kl_pause", threshold=0.3) + rule_toml(name="extra", action="requeue"))
    by_name = {r.name: r for r in exp.watchdog.rules}
    assert by_name["kl_pause"].threshold == 0.3
    assert by_name["extra"].action == "requeue"
    assert len(exp.watchdog.rules) == len(default_rules()) + 1


def test_defaults_false_keeps_only_the_given_rules(tmp_path):
    exp = load(tmp_path, "[watchdog]\ndefaults = false\n" + rule_toml())
    assert [r.name for r in exp.watchdog.rules] == ["mine"]
    assert load(tmp_path, "[watchdog]\ndefaults = false\n").watchdog.rules == []


def test_effective_rules_are_idempotent():
    section = WatchdogSection(rules=[Rule(name="x", metric="m", condition="lt", threshold=1.0, action="pause")])
    assert WatchdogSection(rules=section.rules).rules == section.rules


@pytest.mark.parametrize(("kw", "expected"), [
    ({"action": "raise_kl_coef", "condition": "lt"},
     "watchdog.rules[0].condition: action 'raise_kl_coef' needs condition 'gt', not 'lt'"),
    ({"action": "set_grad_clip", "condition": "drop_frac", "threshold": 0.5},
     "watchdog.rules[0].condition: action 'set_grad_clip' needs condition 'gt' or 'nonfinite'"),
    ({"condition": "drop_frac", "threshold": 1.5},
     "watchdog.rules[0].threshold: 1.5 must be a fraction in (0, 1) for condition 'drop_frac'"),
    ({"condition": "drop_frac", "threshold": 0.2, "window": 1},
     "watchdog.rules[0].window: 1 must be >= 2 for condition 'drop_frac'"),
    ({"action": "explode"}, "watchdog.rules[0].action: \"explode\" is not allowed"),
    ({"condition": "above"}, "watchdog.rules[0].condition: \"above\" is not allowed"),
    ({"lr_scale": 2.0, "action": "rollback"}, "watchdog.rules[0].lr_scale: 2.0 is out of range; must be > 0.0 and <= 1.0"),
    ({"action": "raise_kl_coef", "min_value": 5.0, "max_value": 1.0},
     "watchdog.rules[0].min_value: 5.0 must be below max_value 1.0"),
    ({"factor": 0.5, "action": "raise_kl_coef"}, "watchdog.rules[0].factor: 0.5 is out of range; must be > 1.0"),
])
def test_invalid_rules(tmp_path, kw, expected):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, rule_toml(**kw))
    assert str(info.value).startswith(f"{tmp_path / 'exp.toml'}: {expected}")


def test_missing_rule_field_and_duplicate_names(tmp_path):
    with pytest.raises(ConfigError, match=r"watchdog\.rules\[0\]\.metric: required key is missing"):
        load(tmp_path, '[[watchdog.rules]]\nname = "a"\ncondition = "gt"\naction = "pause"\n')
    with pytest.raises(ConfigError, match="two rules are named 'dup'"):
        load(tmp_path, rule_toml(name="dup") + rule_toml(name="dup"))
