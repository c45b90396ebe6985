"""Strict loading of experiment specs: every user error is one ConfigError naming file, key and what is allowed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcppo.compiler import compile_config
from hpcppo.config import load_experiment
from hpcppo.errors import ConfigError, PathError

BASE = """\
name = "t1"
[model]
path = "models/actor"
[data]
train_files = ["data/train.parquet"]
"""


def write(tmp_path: Path, text: str, name: str = "exp.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def load_error(tmp_path: Path, text: str) -> str:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_experiment(p)
    return str(info.value)


def test_minimal_spec_loads_with_defaults(tmp_path):
    exp = load_experiment(write(tmp_path, BASE))
    assert exp.name == "t1"
    assert exp.actor.lr == 1e-6 and exp.actor.clip_ratio_c == 3.0
    assert exp.algorithm.adv_estimator == "gae"
    assert exp.trainer.train_batch_size == 256
    assert [r.name for r in exp.watchdog.rules][:2] == ["kl_raise_coef", "kl_rollback"]


def test_malformed_toml_names_file_line_and_column(tmp_path):
    msg = load_error(tmp_path, BASE + "[actor]\nlr 1e-6\n")
    assert msg == f"{tmp_path / 'exp.toml'}: line 7, column 4: Expected '=' after a key in a key/value pair"


def test_malformed_toml_at_end_of_file(tmp_path):
    msg = load_error(tmp_path, BASE + "[actor]\nbetas = [0.9,\n")
    assert msg.startswith(f"{tmp_path / 'exp.toml'}: at end of file:")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.toml: file not found"):
        load_experiment(tmp_path / "nope.toml")


def test_unknown_key_suggests_the_close_one(tmp_path):
    msg = load_error(tmp_path, BASE + "[actor]\nclip_ration = 0.3\n")
    assert msg.startswith(f"{tmp_path / 'exp.toml'}: actor.clip_ration: unknown key (did you mean 'clip_ratio'?)")
    assert "known keys here: lr, weight_decay" in msg


def test_unknown_nested_and_top_level_keys(tmp_path):
    assert "actor.fsdp.param_ofload: unknown key (did you mean 'param_offload'?)" in load_error(
        tmp_path, BASE + "[actor.fsdp]\nparam_ofload = true\n")
    assert "rollot: unknown key (did you mean 'rollout'?)" in load_error(tmp_path, BASE + "[rollot]\nn = 2\n")


def test_unknown_key_inside_a_watchdog_rule(tmp_path):
    rule = ('[[watchdog.rules]]\nname = "r"\nmetric = "kl/actor_ref"\ncondition = "gt"\nthreshold = 1.0\n'
            'action = "pause"\ncooldown = 3\n')
    msg = load_error(tmp_path, BASE + rule)
    assert "watchdog.rules[0].cooldown: unknown key (did you mean 'cooldown_steps'?)" in msg


def test_wrong_type_names_key_expected_type_and_value(tmp_path):
    msg = load_error(tmp_path, BASE + '[actor]\nlr = "fast"\n')
    assert msg == f'{tmp_path / "exp.toml"}: actor.lr: expected a float, got "fast" (a string)'


def test_wrong_types_are_not_coerced(tmp_path):
    # cattrs would turn "false" into True, 2.5 into 2 and a string into a list of characters.
    assert 'model.trust_remote_code: expected a boolean (true or false), got "false" (a string)' in load_error(
        tmp_path, BASE.replace('path = "models/actor"', 'path = "m"\ntrust_remote_code = "false"'))
    assert "trainer.train_batch_size: expected an integer, got 2.5 (a float)" in load_error(
        tmp_path, BASE + "[trainer]\ntrain_batch_size = 2.5\n")
    assert 'data.train_files: expected an array of string, got "a.parquet" (a string)' in load_error(
        tmp_path, BASE.replace('train_files = ["data/train.parquet"]', 'train_files = "a.parquet"'))
    assert "actor.betas[1]: expected a float, got true (a boolean)" in load_error(
        tmp_path, BASE + "[actor]\nbetas = [0.9, true]\n")
    assert "actor.fsdp: expected a table (section), got 3" in load_error(tmp_path, BASE + "[actor]\nfsdp = 3\n")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("[actor]\nclip_ratio_c = 1.0\n", "actor.clip_ratio_c: 1.0 is out of range; must be > 1.0"),
        ("[algorithm]\ngamma = 1.5\n", "algorithm.gamma: 1.5 is out of range; must be >= 0.0 and <= 1.0"),
        ("[actor]\nlr = -1e-6\n", "actor.lr: -1e-06 is out of range; must be > 0.0"),
        ("[resources]\nnodes = 0\n", "resources.nodes: 0 is out of range; must be >= 1"),
        ('[algorithm]\nadv_estimator = "grpoo"\n',
         "algorithm.adv_estimator: \"grpoo\" is not allowed; allowed values: \"gae\", \"grpo\", \"rloo\", "
         "\"reinforce_plus_plus\", \"reinforce_plus_plus_baseline\", \"remax\", \"gpg\", \"opo\", \"grpo_passk\", "
         "\"optimal_token_baseline\", \"tir_optimal_token_baseline\" (did you mean 'grpo'?)"),
        ('[actor]\nkl_loss_type = "k4"\n', "actor.kl_loss_type: \"k4\" is not allowed"),
        ('[resources]\ntime = "1:2:3:4"\n', "resources.time: '1:2:3:4' is not a Slurm time"),
        ('reward_fn = "nocolon"\n', "data.reward_fn: 'nocolon' must be \"auto\", a built-in (gsm8k, math, "
                                     "math_verify, math_dapo, arith, arith_tool) or \"module:function\""),
        ("[actor]\nbetas = [0.9]\n", "actor.betas: [0.9] must be two numbers in [0, 1)"),
        ('name = "bad name"\n', "name: \"bad name\" does not match"),
        ("[rollout]\ntop_k = 0\n", "rollout.top_k: 0 must be -1 (off) or > 0"),
        ("[algorithm.kl_ctrl]\nmin_coef = 20.0\n", "algorithm.kl_ctrl.min_coef: 20.0 must be below max_coef 10.0"),
    ],
)
def test_out_of_range_values(tmp_path, extra, expected):
    # Keys without a table header land in [data], the last table of BASE; "name" replaces the first line.
    text = BASE + extra if not extra.startswith("name") else extra + BASE.split("\n", 1)[1]
    msg = load_error(tmp_path, text)
    assert msg.startswith(str(tmp_path / "exp.toml") + ": ")
    assert expected in msg


def test_kl_estimator_plus_variants_are_allowed(tmp_path):
    exp = load_experiment(write(tmp_path, BASE + '[actor]\nkl_loss_type = "k3+"\n[algorithm]\nkl_penalty = "low_var_kl+"\n'))
    assert exp.actor.kl_loss_type == "k3+" and exp.algorithm.kl_penalty == "low_var_kl+"


def test_missing_required_keys(tmp_path):
    msg = load_error(tmp_path, 'name = "x"\n[data]\ntrain_files = ["a"]\n')
    assert msg == f"{tmp_path / 'exp.toml'}: model: required key is missing"
    msg = load_error(tmp_path, 'name = "x"\n[model]\n[data]\ntrain_files = ["a"]\n')
    assert msg == f"{tmp_path / 'exp.toml'}: model.path: required key is missing"
    msg = load_error(tmp_path, 'name = "x"\n[model]\npath = "m"\n[data]\ntrain_files = []\n')
    assert "data.train_files: needs at least one Parquet file" in msg


def test_relative_paths_resolve_against_the_spec_directory(tmp_path, monkeypatch):
    sub = tmp_path / "specs"
    sub.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HPCPPO_TEST_DATA", str(tmp_path / "shared"))
    text = BASE.replace('"data/train.parquet"', '"data/train.parquet", "$HPCPPO_TEST_DATA/x.parquet", "/abs/y.parquet"')
    exp = load_experiment(write(sub, text))
    assert exp.model.path == str(sub / "models" / "actor")
    assert exp.data.train_files == [str(sub / "data" / "train.parquet"), str(tmp_path / "shared" / "x.parquet"),
                                    "/abs/y.parquet"]
    assert exp.model.critic_path == ""  # empty stays empty (= model.path)


def test_home_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    exp = load_experiment(write(tmp_path, BASE.replace('"models/actor"', '"~/models/actor"')))
    assert exp.model.path == str(tmp_path / "home" / "models" / "actor")


def _real_paths(tmp_path: Path) -> Path:
    (tmp_path / "models" / "actor").mkdir(parents=True)
    (tmp_path / "models" / "actor" / "config.json").write_text('{"max_position_embeddings": 4096}')
    (tmp_path / "data").mkdir()
    # compile reads the data (hpcppo.data.check): a real verl-schema file with one batch of rows.
    from hpcppo.data.dataset import write_prompts_parquet

    write_prompts_parquet([{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"q{i}"}],
                            "reward_model": {"style": "rule", "ground_truth": str(i)}} for i in range(8)],
                          tmp_path / "data" / "train.parquet")
    return write(tmp_path, BASE + "[trainer]\ntrain_batch_size = 8\n[actor]\nppo_mini_batch_size = 8\n"
                                  "ppo_micro_batch_size_per_gpu = 1\n")


def test_compile_checks_paths_and_can_skip(tmp_path):
    spec = _real_paths(tmp_path)
    compiled = compile_config(spec, "local")
    assert compiled.plan.world_size == 2
    (tmp_path / "data" / "train.parquet").unlink()
    with pytest.raises(PathError) as info:
        compile_config(spec, "local")
    assert str(info.value) == f"data.train_files[0]: {tmp_path / 'data' / 'train.parquet'} does not exist"
    assert compile_config(spec, "local", check_paths=False).experiment.data.train_files
    (tmp_path / "models" / "actor" / "config.json").unlink()
    with pytest.raises(PathError, match=r"model\.path: .*actor holds no model \(no config\.json\)"):
        compile_config(spec, "local")
    os.rmdir(tmp_path / "models" / "actor")
    (tmp_path / "models" / "actor").write_text("not a dir")
    with pytest.raises(PathError, match=r"model\.path: .*actor is not a directory"):
        compile_config(spec, "local")
