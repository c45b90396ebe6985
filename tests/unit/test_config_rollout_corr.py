"""``[algorithm.rollout_correction]``: verl's names and defaults, the checks, -o values, the run's columns."""

from __future__ import annotations

import pytest

from hpcppo import rollout_corr
from hpcppo.config.fields import FieldValueError
from hpcppo.config.rollout_corr import RolloutCorrectionSection, correction_on, metric_columns
from hpcppo.errors import HpcppoError
from hpcppo.launch import jobs
from hpcppo.rundir import metric_names

SPEC = """
name = "rc"
[model]
path = "m"
[data]
train_files = ["t.parquet"]
[rollout]
n = 2
[actor]
ppo_mini_batch_size = 4
[trainer]
train_batch_size = 8
total_steps = 1
"""
K = "algorithm.rollout_correction."


def _compile(tmp_path, *overrides):
    spec = tmp_path / "exp.toml"
    spec.write_text(SPEC)
    return jobs.compile_run(spec, "local", list(overrides), runs_root=str(tmp_path / "runs"), check_paths=False)


def test_defaults_are_verls_yaml_everything_off():
    s = RolloutCorrectionSection()
    assert (s.rollout_is, s.rollout_is_threshold, s.rollout_is_batch_normalize, s.rollout_rs, s.rollout_rs_threshold,
            s.bypass_mode, s.loss_type) == (None, 2.0, False, None, None, False, "ppo_clip")
    assert not correction_on(s) and metric_columns(s) == []


@pytest.mark.parametrize("kw, key", [
    ({"rollout_rs": "token_k2"}, "rollout_rs_threshold"),  # no threshold
    ({"rollout_rs": "token_k2", "rollout_rs_threshold": "0.1_0.2"}, "rollout_rs_threshold"),
    ({"rollout_rs": "token_k1,seq_max_k2,token_k3", "rollout_rs_threshold": "1,2"}, "rollout_rs_threshold"),
    ({"rollout_rs": "seq_max_k1", "rollout_rs_threshold": 2.0}, "rollout_rs"),
    ({"rollout_rs_threshold": 2.0}, "rollout_rs_threshold"),  # does nothing without rollout_rs
    ({"loss_type": "reinforce"}, "loss_type"),  # does nothing without bypass_mode
    ({"rollout_is_batch_normalize": True}, "rollout_is_batch_normalize"),
    ({"rollout_is_threshold": 5.0}, "rollout_is_threshold"),
    ({"rollout_is": "geometric"}, "rollout_is"),
    ({"rollout_is": "token", "rollout_is_threshold": 0.0}, "rollout_is_threshold"),
])
def test_bad_settings_name_their_key(kw, key):
    with pytest.raises(FieldValueError) as err:
        RolloutCorrectionSection(**kw)
    assert err.value.field == key


def test_overrides_take_verls_spellings_and_the_columns_follow(tmp_path):
    crun = _compile(tmp_path, K + "rollout_is=token", K + "rollout_rs=token_k1,seq_max_k2",
                    K + "rollout_rs_threshold=0.6_1.6,2.5", K + "rollout_is_batch_normalize=true")
    rc = crun.compiled.experiment.algorithm.rollout_correction
    assert (rc.rollout_is, rc.rollout_rs, rc.rollout_rs_threshold) == ("token", "token_k1,seq_max_k2", "0.6_1.6,2.5")
    cols = metric_columns(rc)
    assert cols == rollout_corr.metric_names("token", True, "token_k1,seq_max_k2")
    assert "rollout_corr/rollout_is_batch_norm_factor" in cols and "rollout_corr/chi2_seq" in cols
    assert not any(c in metric_names.STANDARD_COLUMNS for c in cols)
    # a number stays a number, and "1_2" (TOML's 12) stays the k1 bounds it means
    rc = _compile(tmp_path, K + "rollout_rs=seq_mean_k3", K + "rollout_rs_threshold=0.01"
                  ).compiled.experiment.algorithm.rollout_correction
    assert rc.rollout_rs_threshold == 0.01
    rc = _compile(tmp_path, K + "rollout_rs=token_k1", K + "rollout_rs_threshold=1_2"
                  ).compiled.experiment.algorithm.rollout_correction
    assert rc.rollout_rs_threshold == "1_2"


def test_bypass_mode_replaces_the_loss_mode_so_another_one_is_refused(tmp_path):
    with pytest.raises(HpcppoError, match="bypass_mode=true uses its own loss"):
        _compile(tmp_path, K + "bypass_mode=true", "actor.policy_loss.loss_mode=gspo")
    _compile(tmp_path, K + "bypass_mode=true", K + "loss_type=reinforce")


def test_new_group_estimators_compile_and_the_token_baselines_only_without_bypass_mode(tmp_path):
    for name in ("opo", "grpo_passk", "optimal_token_baseline", "tir_optimal_token_baseline"):
        _compile(tmp_path, f"algorithm.adv_estimator={name}")
    _compile(tmp_path, "algorithm.adv_estimator=optimal_token_baseline", K + "rollout_is=token")  # decoupled: IS
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):  # verl: no pass, no sum_pi_squared
        with pytest.raises(HpcppoError, match=f"adv_estimator='{name}' needs the old-log-prob pass's sum_pi_squared, "
                                              "which algorithm.rollout_correction.bypass_mode=true skips"):
            _compile(tmp_path, f"algorithm.adv_estimator={name}", K + "bypass_mode=true")


def test_a_watchdog_rule_may_watch_the_corrections_columns_when_it_is_on(tmp_path):
    spec = tmp_path / "exp.toml"
    spec.write_text(SPEC + '\n[[watchdog.rules]]\nname = "gap"\nmetric = "rollout_corr/kl"\ncondition = "gt"\n'
                           'threshold = 0.5\naction = "pause"\n')
    with pytest.raises(HpcppoError, match="'rollout_corr/kl' is not logged"):
        jobs.compile_run(spec, "local", [], runs_root=str(tmp_path / "runs"), check_paths=False)
    jobs.compile_run(spec, "local", [K + "rollout_is=token"], runs_root=str(tmp_path / "runs"), check_paths=False)


def test_plan_counts_no_extra_pass_and_bypass_mode_drops_the_old_log_prob_one(capsys):
    import json
    from pathlib import Path

    from hpcppo.cli import main

    spec = Path(__file__).resolve().parents[2] / "examples" / "gsm8k-qwen2.5-7b.toml"

    def flops(*overrides):
        assert main(["plan", str(spec), "--site", "a100-cluster", "--json",
                     *(x for o in overrides for x in ("-o", o))]) == 0
        return json.loads(capsys.readouterr().out)["time"]["update_flops"]

    plain = flops()
    assert flops(K + "rollout_is=token", K + "rollout_rs=token_k2", K + "rollout_rs_threshold=0.1") == plain
    bypass = flops(K + "bypass_mode=true")
    assert 0 < bypass < plain
