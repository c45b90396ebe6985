"""The weight-sync guard's limit (``rollout.logprob_gap_max``, :mod:`hpcppo.config.sync_guard`): the defaults per
dtype pair, the value a spec sets, its help/explain/did-you-mean, the resolved plan, and the one line that stops
a run. The stop itself on a real run: ``tests/e2e/test_sync_guard_run.py``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hpcppo.config import ActorSection, DataSection, Experiment, ModelSection, RolloutSection, explain, resolve
from hpcppo.config.experiment import FsdpSection
from hpcppo.config import load_experiment
from hpcppo.config.site import LocalSection, Site
from hpcppo.config.sync_guard import (FULL_PRECISION_GAP_MAX, HALF_PRECISION_GAP_MAX, default_logprob_gap_max,
                                      gap_verdict, logprob_gap_max)
from hpcppo.errors import ConfigError

LOCAL = Site(name="l", scheduler="local", local=LocalSection(procs_per_node=1))


def plan_of(model_dtype: str, param_dtype: str = "", gap: float = 0.0):
    e = Experiment(name="t", model=ModelSection(path="/m", dtype=model_dtype),
                   data=DataSection(train_files=["/d.parquet"]), rollout=RolloutSection(logprob_gap_max=gap),
                   actor=ActorSection(fsdp=FsdpSection(param_dtype=param_dtype)))
    return resolve(LOCAL, e)


def test_the_default_follows_the_engine_and_trainer_dtypes():
    assert default_logprob_gap_max("float32", "float32") == (1e-3, "the default for a float32 engine, float32 trainer")
    assert default_logprob_gap_max("bfloat16", "float32")[0] == HALF_PRECISION_GAP_MAX
    assert default_logprob_gap_max("float32", "bfloat16")[0] == HALF_PRECISION_GAP_MAX
    assert default_logprob_gap_max("bfloat16", "bfloat16")[0] == HALF_PRECISION_GAP_MAX
    assert FULL_PRECISION_GAP_MAX < HALF_PRECISION_GAP_MAX
    # the plan: the engine computes in model.dtype, the trainer in the actor's param_dtype (model.dtype when unset)
    p = plan_of("float32")
    assert (p.logprob_gap_max, p.logprob_gap_max_from) == (1e-3, "the default for a float32 engine, float32 trainer")
    p = plan_of("bfloat16", "float32")
    assert p.logprob_gap_max_from == "the default for a bfloat16 engine, float32 trainer"
    assert p.logprob_gap_max == HALF_PRECISION_GAP_MAX


def test_a_value_the_spec_sets_takes_effect_and_minus_one_turns_the_guard_off(tmp_path: Path):
    assert (plan_of("bfloat16", gap=0.5).logprob_gap_max, plan_of("bfloat16", gap=0.5).logprob_gap_max_from) == \
        (0.5, "rollout.logprob_gap_max")
    assert logprob_gap_max(-1, "float32", "float32") == (-1.0, "rollout.logprob_gap_max = -1: the guard is off")
    spec = tmp_path / "exp.toml"
    spec.write_text('name = "t"\n[model]\npath = "m"\n[data]\ntrain_files = ["d.parquet"]\n'
                    '[rollout]\nlogprob_gap_max = -1\n')
    assert load_experiment(spec).rollout.logprob_gap_max == -1


def test_vllm_with_top_p_or_top_k_widens_or_switches_off_the_default_but_not_a_set_limit():
    limit, source = logprob_gap_max(0.0, "float32", "float32", engine="vllm", top_p=0.9)
    assert limit == pytest.approx(1e-3 - math.log(0.9)) and "-log(rollout.top_p) = 0.1054" in source
    limit, source = logprob_gap_max(0.0, "bfloat16", "float32", engine="vllm", top_k=20)
    assert limit == -1.0 and source.startswith("off by default with rollout.top_k = 20 on vllm")
    assert logprob_gap_max(0.02, "bfloat16", "float32", engine="vllm", top_k=20) == (0.02, "rollout.logprob_gap_max")
    # the HF engine reports log-probs before the truncation: no change
    assert logprob_gap_max(0.0, "float32", "float32", engine="hf", top_p=0.5, top_k=5)[0] == FULL_PRECISION_GAP_MAX


@pytest.mark.parametrize(("line", "expected"), [
    ("logprob_gap_max = -0.1", "rollout.logprob_gap_max: -0.1 must be -1 (off), 0 (the default) or > 0"),
    ("logprob_gap_max = nan", "rollout.logprob_gap_max: nan is not allowed; a finite number is expected"),
    ("logprob_gap = 0.1", "rollout.logprob_gap: unknown key (did you mean 'logprob_gap_max'?)"),
])
def test_a_bad_value_or_a_misspelt_key_is_one_line_naming_the_key(tmp_path: Path, line: str, expected: str):
    spec = tmp_path / "exp.toml"
    spec.write_text(f'name = "t"\n[model]\npath = "m"\n[data]\ntrain_files = ["d.parquet"]\n[rollout]\n{line}\n')
    with pytest.raises(ConfigError) as info:
        load_experiment(spec)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_config_explain_says_what_the_key_does_and_its_defaults():
    text = explain("rollout.logprob_gap_max")
    assert "rollout/logprob_gap" in text and "float32 engine and trainer: 1e-3" in text and "-1 = off" in text
    assert "default: 0.0" in text
    assert "weight-sync guard" in explain("plan.logprob_gap_max")


def test_the_verdict_is_one_line_with_the_gap_the_limit_and_where_the_limit_comes_from():
    assert gap_verdict(2e-4, 1e-3, "x", step=3, engine="vllm") is None
    assert gap_verdict(0.5, -1.0, "x", step=3, engine="vllm") is None  # off
    assert gap_verdict(math.nan, -1.0, "x", step=3, engine="vllm") is None
    line = gap_verdict(0.8123, 1e-3, "the default for a bfloat16 engine, float32 trainer", step=3, engine="vllm")
    assert line is not None and "\n" not in line
    assert line.startswith("the rollout engine (vllm) and the trainer disagree after the weight sync of step 3: ")
    assert "differ by 0.8123 per token" in line and "above 0.001 (the default for a bfloat16 engine" in line
    assert gap_verdict(math.nan, 1e-3, "x", step=1, engine="hf") is not None  # NaN is never "within the limit"
