"""verl key names where hpcppo keys are typed (issue 10 item 2): ``-o``, ``config explain``, and unknown keys in a
spec get the hpcppo key from the verl table before any spelling suggestion."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.compiler import compile_config
from hpcppo.config import explain, parse_overrides
from hpcppo.verl.names import VerlNameWarning
from hpcppo.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"


def test_o_with_a_verl_key_is_applied_under_the_hpcppo_name_with_a_warning():
    with pytest.warns(VerlNameWarning, match=r"actor_rollout_ref\.actor\.clip_ratio_c=4\.0 is verl's name; in hpcppo "
                                             r"this is actor\.clip_ratio_c: applied as actor\.clip_ratio_c = 4\.0"):
        compiled = compile_config(ARITH, "local", ["actor_rollout_ref.actor.clip_ratio_c=4.0"], check_paths=False)
    assert compiled.experiment.actor.clip_ratio_c == 4.0
    assert compiled.provenance["actor.clip_ratio_c"] == "override"


def test_o_translates_verl_values_too():
    with pytest.warns(VerlNameWarning):
        exp, _ = parse_overrides(["trainer.save_freq=0", "data.train_batch_size=8", "trainer.nnodes=1"])
    # verl never saves with save_freq 0; hpcppo's 0 would save at the end, so it becomes -1.
    assert exp == {"checkpoint": {"save_every": -1}, "trainer": {"train_batch_size": 8}, "resources": {"nodes": 1}}


def test_hpcppo_keys_win_and_warn_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exp, _ = parse_overrides(["critic.ppo_micro_batch_size_per_gpu=2", "trainer.test_freq=5"])
    assert exp == {"critic": {"ppo_micro_batch_size_per_gpu": 2}, "trainer": {"test_freq": 5}}


@pytest.mark.parametrize("item, pointer", [
    # needs other keys (the number of GPUs) to translate
    ("actor_rollout_ref.actor.ppo_micro_batch_size=64", "in hpcppo this is `actor.ppo_micro_batch_size_per_gpu`"),
    # no effect under FSDP2
    ("actor_rollout_ref.actor.fsdp_config.forward_prefetch=True", "an FSDP1 option"),
    # verl does not have it
    ("actor_rollout_ref.actor.use_dual_clip=True", "in hpcppo this is `actor.clip_ratio_c`"),
    ("critic.vf_clip_param=0.2", "in hpcppo this is `critic.cliprange_value`"),
    # not supported
    ("reward_model.enable_resource_pool=True", "hpcppo does not support it"),
    # a verl value with no counterpart
    ("actor_rollout_ref.rollout.name=sglang", "in hpcppo this is `rollout.engine`"),
])
def test_o_with_other_verl_keys_is_refused_with_the_pointer(item, pointer):
    with pytest.raises(ConfigError) as info:
        parse_overrides([item])
    assert pointer in str(info.value) and str(info.value).startswith("command line (-o): ")


def test_did_you_mean_prefers_the_verl_table_over_spelling(tmp_path):
    spec = tmp_path / "exp.toml"
    spec.write_text('name = "x"\n[model]\npath = "m"\n[data]\ntrain_files = ["a.parquet"]\n[trainer]\nsave_freq = 3\n')
    with pytest.raises(ConfigError) as info:
        compile_config(spec, "local", check_paths=False)
    text = str(info.value)
    # Spelling alone suggests test_freq; the table knows save_freq is checkpoint.save_every.
    assert "in hpcppo this is `checkpoint.save_every`" in text and "test_freq'?" not in text
    with pytest.raises(ConfigError, match=r"actor\.optim: unknown key \(actor\.optim\.lr looks like verl's "
                                          r"actor_rollout_ref\.actor\.optim\.lr; in hpcppo this is `actor\.lr`\)"):
        parse_overrides(["actor.optim.lr=1e-6"])
    with pytest.raises(ConfigError, match=r"did you mean 'lr'\?"):  # not a verl name: spelling as before
        parse_overrides(["actor.lrr=1"])
    with pytest.raises(ConfigError, match=r"did you mean 'partition'\?"):  # site keys are not verl's
        parse_overrides(["site.slurm.partitio=gpu"])


def test_config_explain_answers_a_verl_name():
    text = explain("data.train_batch_size")
    first, _, rest = text.partition("\n\n")
    assert first == ("data.train_batch_size is verl's name; in hpcppo this is `trainer.train_batch_size` (prompts per "
                     "step, as in verl)")
    assert rest.startswith("trainer.train_batch_size\n  Prompts per step.")
    assert "hpcppo has no such setting and needs none: an FSDP1 option" in explain(
        "actor_rollout_ref.actor.fsdp_config.forward_prefetch")
    assert explain("rollout.name").startswith("rollout.name looks like verl's actor_rollout_ref.rollout.name; in "
                                              "hpcppo this is `rollout.engine`")
    with pytest.raises(ConfigError, match="unknown key"):
        explain("data.no_such_key")


def test_cli_prints_the_warning_as_one_line(tmp_path, capsys):
    rc = main(["config", "show", str(ARITH), "-o", "actor_rollout_ref.actor.clip_ratio_c=4.0"])
    err = capsys.readouterr().err
    assert rc == 0
    assert err.splitlines() == ["hpcppo: warning: -o actor_rollout_ref.actor.clip_ratio_c=4.0 is verl's name; in hpcppo "
                                "this is actor.clip_ratio_c: applied as actor.clip_ratio_c = 4.0"]
    assert main(["config", "explain", "trainer.save_freq"]) == 0
    assert "in hpcppo this is `checkpoint.save_every`" in capsys.readouterr().out


def test_a_verl_key_in_a_sites_defaults_gets_the_pointer(tmp_path):
    site = tmp_path / "mysite.toml"
    site.write_text('name = "mysite"\nscheduler = "local"\n[defaults.trainer]\nsave_freq = 10\n')
    with pytest.raises(ConfigError) as info:
        compile_config(ARITH, site, check_paths=False)
    text = str(info.value)
    assert "mysite.toml: defaults.trainer.save_freq: unknown key" in text
    assert "in hpcppo this is `checkpoint.save_every`" in text
