"""``hpcppo watchdog replay``: the rules of a run (or of a rules file) over its real HDF5 metric log.

The run directory is a compiled ``examples/arith-tiny.toml`` whose watchdog rules are set back to the
built-in ones (``-o watchdog.rules=[]``), so the test does not depend on thresholds the example may tune.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.config import default_rules
from hpcppo.config.watchdog import Rule
from hpcppo.errors import ConfigError, RunIdError
from hpcppo.metrics import STANDARD_COLUMNS, MetricsWriter
from hpcppo.watchdog.replay import load_rules, logged_rows, replay, summarize_replay

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"
NAN = float("nan")
# KL crosses 0.05 (raise kl_coef + roll back), 0.1 (pause) and 0.05 again once the cooldowns are over.
KL = {10: 0.06, 11: 0.06, 20: 0.12, 25: 0.07}


def make_run(runs: Path, capsys) -> Path:
    assert main(["compile", str(ARITH), "--site", "local", "--no-check-paths", "-q", "--runs-root", str(runs),
                 "-o", "watchdog.rules=[]", "-o", "watchdog.defaults=true"]) == 0  # fmt: skip
    capsys.readouterr()
    [run] = runs.iterdir()
    return run


def write_log(run: Path, steps: int = 30, *, vf_loss=lambda s: NAN if s == 15 else 0.5) -> None:
    with MetricsWriter(run, STANDARD_COLUMNS, attempt=1) as w:
        for s in range(steps):
            row = {"kl/actor_ref": KL.get(s, 0.01), "reward/mean": 1.0, "critic/vf_loss": vf_loss(s)}
            if s >= 3:  # logged from step 3 on, as actor metrics after a critic warm-up
                row["actor/grad_norm"] = 1.0
            w.log(s, row)


def replay_cli(capsys, runs: Path, *argv: str) -> tuple[int, str, str]:
    rc = main(["watchdog", "replay", *argv, "--runs-root", str(runs)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture()
def run(tmp_path, capsys) -> Path:
    return make_run(tmp_path / "runs", capsys)


def test_replay_with_the_runs_rules_step_by_step(run, capsys):
    write_log(run)
    rc, out, err = replay_cli(capsys, run.parent, run.name)
    assert (rc, err) == (0, "")
    assert out.splitlines() == [
        f"replay of {run.name}: 6 rules from {run / 'resolved.toml'} over 30 logged steps (steps 0..29)",
        "  note: rule value_loss_nonfinite: critic/vf_loss is NaN at 1 step(s) after it was first logged (15); "
        "taken as NaN values (a metric logged only every few steps would look the same)",
        "step 10  kl_rollback        rollback      kl/actor_ref=0.06 > 0.05  (lr x0.5, total x0.5)",
        "step 10  kl_raise_coef      raise_kl_coef kl/actor_ref=0.06 > 0.05  (kl_coef x1.5, within [0.0001, 10])",
        "step 15  value_loss_nonfinite restart_critic critic/vf_loss=nan is not finite  "
        "(critic from its last good weights)",
        "step 20  kl_pause           pause         kl/actor_ref=0.12 > 0.1  (checkpoint and stop, no requeue)",
        "step 25  kl_rollback        rollback      kl/actor_ref=0.07 > 0.05  (lr x0.5, total x0.25)",
        "step 25  kl_raise_coef      raise_kl_coef kl/actor_ref=0.07 > 0.05  (kl_coef x1.5, within [0.0001, 10])",
        "6 actions would have fired over 30 steps: 1 pause, 2 rollback, 1 restart_critic, 2 raise_kl_coef",
    ]  # fmt: skip


def test_a_metric_never_logged_is_not_a_nan_value(run, capsys):
    """critic/vf_loss declared but never logged (no critic): the nonfinite rule must not fire at step 0."""
    write_log(run, 12, vf_loss=lambda s: NAN)
    rc, out, _ = replay_cli(capsys, run.parent, run.name)
    assert rc == 0
    assert "restart_critic" not in out
    assert ("  note: rule value_loss_nonfinite: critic/vf_loss is NaN in every row; taken as never logged, so the "
            "rule cannot fire (the log cannot tell a NaN value from a value not logged)") in out.splitlines()
    assert out.splitlines()[-1] == "2 actions would have fired over 12 steps: 1 rollback, 1 raise_kl_coef"


def test_a_custom_rules_file(run, tmp_path, capsys):
    write_log(run)
    rules = tmp_path / "rules.toml"
    rules.write_text('defaults = false\n\n[[rules]]\nname = "kl_tight"\nmetric = "kl/actor_ref"\ncondition = "gt"\n'
                     'threshold = 0.065\naction = "rollback"\nlr_scale = 0.25\ncooldown_steps = 0\nmax_count = 2\n')
    rc, out, _ = replay_cli(capsys, run.parent, run.name, "--rules", str(rules))
    assert rc == 0
    assert out.splitlines() == [
        f"replay of {run.name}: 1 rules from {rules} over 30 logged steps (steps 0..29)",
        "step 20  kl_tight           rollback      kl/actor_ref=0.12 > 0.065  (lr x0.25, total x0.25)",
        "step 25  kl_tight           rollback      kl/actor_ref=0.07 > 0.065  (lr x0.25, total x0.0625)",
        "2 actions would have fired over 30 steps: 2 rollback",
    ]


def test_a_rules_file_with_defaults_adds_and_replaces_by_name(run, tmp_path, capsys):
    write_log(run)
    rules = tmp_path / "rules.toml"
    # kl_pause replaced by a looser one; the other built-in rules stay
    rules.write_text('[[rules]]\nname = "kl_pause"\nmetric = "kl/actor_ref"\ncondition = "gt"\nthreshold = 0.5\n'
                     'action = "pause"\n')
    rc, out, _ = replay_cli(capsys, run.parent, run.name, "--rules", str(rules))
    assert rc == 0 and "pause" not in out.split("\n", 1)[1]
    assert out.splitlines()[-1] == ("5 actions would have fired over 30 steps: 2 rollback, 1 restart_critic, "
                                    "2 raise_kl_coef")
    assert [r.name for r in load_rules(rules)] == [r.name for r in default_rules() if r.name != "kl_pause"] + ["kl_pause"]


def test_nothing_fires(run, capsys, tmp_path):
    write_log(run, 5)
    rules = tmp_path / "none.toml"
    rules.write_text("defaults = false\n")
    rc, out, _ = replay_cli(capsys, run.parent, run.name, "--rules", str(rules))
    assert rc == 0 and out.splitlines()[-1] == "no rule would have fired over 5 steps"


def test_a_run_without_metrics_yet(run, capsys):
    rc, out, _ = replay_cli(capsys, run.parent, run.name)
    assert rc == 0
    assert out.splitlines() == [f"replay of {run.name}: 6 rules from {run / 'resolved.toml'} over 0 logged steps",
                                "no rule would have fired over 0 steps"]


def test_a_rule_on_a_metric_the_log_does_not_have(run, tmp_path, capsys):
    write_log(run, 3)
    rules = tmp_path / "typo.toml"
    rules.write_text('defaults = false\n[[rules]]\nname = "typo"\nmetric = "kl/actor_reff"\ncondition = "gt"\n'
                     'threshold = 0.1\naction = "pause"\n')
    rc, out, _ = replay_cli(capsys, run.parent, run.name, "--rules", str(rules))
    assert rc == 0
    assert "  note: rules on 'kl/actor_reff' never fire: the run's metric log has no such column" in out.splitlines()


def test_json_output_is_strict_json(run, capsys):
    write_log(run)
    rc, out, _ = replay_cli(capsys, run.parent, run.name, "--json")
    assert rc == 0
    data = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert (data["run"], data["steps"], data["first_step"], data["last_step"]) == (run.name, 30, 0, 29)
    assert data["rules"] == [r.name for r in default_rules()]
    assert [d["step"] for d in data["decisions"]] == [10, 15, 20, 25]
    assert data["decisions"][1]["actions"][0]["value"] == "nan"
    assert data["decisions"][3]["state"]["lr_scale"] == 0.25
    assert data["summary"].startswith("6 actions would have fired")
    assert len(data["notes"]) == 1


# ----------------------------------------------------------------------------- errors
def _bad_rules(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return path


RULE = 'name = "r"\nmetric = "kl/actor_ref"\ncondition = "gt"\nthreshold = 0.1\naction = "pause"\n'


@pytest.mark.parametrize(("text", "message"), [
    ("rule = 1\n", "bad.toml: rule: unknown key (did you mean 'rules'?); known keys here: defaults, rules"),
    ("defaults = 1\n", "bad.toml: defaults: expected a boolean (true or false), got 1 (an integer)"),
    ("[[rules]]\n" + RULE.replace('"pause"', '"explode"'),
     'bad.toml: rules[0].action: "explode" is not allowed; allowed values: "raise_kl_coef", "rollback"'),
    ("[[rules]]\n" + RULE + "[[rules]]\n" + RULE.replace("0.1", "nan"), "bad.toml: rules[1].threshold:"),
    ("[[rules]]\n" + RULE + "thresold = 2\n", "bad.toml: rules[0].thresold: unknown key (did you mean 'threshold'?)"),
    ("[[rules]]\n" + RULE + "[[rules]]\n" + RULE, "bad.toml: rules: two rules are named 'r'"),
    ("[[rules]]\nname = \"r\"\n", "bad.toml: rules[0].metric: required key is missing"),
    ("[[rules\n", "bad.toml: line 1, column 8"),
])  # fmt: skip
def test_a_bad_rules_file_names_the_file_and_the_key(run, tmp_path, capsys, text, message):
    write_log(run, 3)
    rc, out, err = replay_cli(capsys, run.parent, run.name, "--rules", str(_bad_rules(tmp_path, text)))
    assert rc == ConfigError.exit_code and out == ""
    [line] = err.splitlines()
    assert line.startswith("hpcppo: error: ") and str(tmp_path) in line
    assert message in line, line


def test_a_missing_rules_file(run, tmp_path, capsys):
    rc, _, err = replay_cli(capsys, run.parent, run.name, "--rules", str(tmp_path / "nope.toml"))
    assert rc == ConfigError.exit_code and err == f"hpcppo: error: {tmp_path / 'nope.toml'}: file not found\n"


@pytest.mark.parametrize("run_id", ["nope-20250101-000000-abcd", "../etc", "a/b"])
def test_an_unknown_or_unsafe_run(run, capsys, run_id):
    rc, out, err = replay_cli(capsys, run.parent, run_id)
    assert rc == RunIdError.exit_code and out == ""
    [line] = err.splitlines()
    if "/" in run_id:
        assert line.startswith(f"hpcppo: error: invalid run id {run_id!r}")
    else:
        assert line == f"hpcppo: error: no run {run_id!r} (runs under {run.parent}: {run.name})"


# ----------------------------------------------------------------------------- the pure helpers
def test_logged_rows_drops_only_the_nans_before_a_metric_was_first_logged():
    rows = [{"step": 0, "a": NAN, "b": NAN, "c": 1.0},
            {"step": 1, "a": 2.0, "b": NAN, "c": NAN},
            {"step": 2, "a": NAN, "b": NAN, "c": math.inf}]  # fmt: skip
    out, notes = logged_rows(rows, [])
    assert out[0] == {"step": 0, "c": 1.0}
    assert out[1] == {"step": 1, "a": 2.0, "c": out[1]["c"]} and math.isnan(out[1]["c"])
    assert set(out[2]) == {"step", "a", "c"} and math.isnan(out[2]["a"]) and out[2]["c"] == math.inf
    assert notes == []  # no nonfinite rule: the NaNs cannot change a decision
    rule = Rule(name="a_nan", metric="a", condition="nonfinite", action="restart_critic")
    _, notes = logged_rows(rows, [rule])
    assert notes == ["rule a_nan: a is NaN before step 1; taken as not logged yet",
                     "rule a_nan: a is NaN at 1 step(s) after it was first logged (2); taken as NaN values (a metric "
                     "logged only every few steps would look the same)"]
    assert [step for step, _ in replay(logged_rows(rows, [rule])[0], [rule])] == [2]


def test_summarize_replay_counts_applied_and_suppressed():
    rules = [Rule(name="p", metric="m", condition="gt", threshold=1.0, action="pause"),
             Rule(name="r", metric="m", condition="gt", threshold=1.0, action="rollback")]
    results = replay([{"step": 4, "m": 2.0}], rules)
    assert summarize_replay(results, 1) == ("1 action would have fired over 1 step: 1 pause "
                                             "(1 more matched but was suppressed)")
    assert summarize_replay([], 1) == "no rule would have fired over 1 step"
    assert summarize_replay(results, 2).startswith("1 action would have fired over 2 steps: ")
