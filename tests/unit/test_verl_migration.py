"""A verl user's run script imports as verl would run it, or says why not (issue 22): one test per translation that
used to be silently wrong, each checked against verl b178a3c."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpcppo.cli import main
from hpcppo.config.experiment import ActorSection
from hpcppo.config.fields import FieldValueError
from hpcppo.verl.importer import import_verl, read_command_line, read_yaml, translate
from hpcppo.errors import ConfigError

CMD = "python3 -m verl.trainer.main_ppo "
A = "actor_rollout_ref.actor."


def _imp(text: str, environ=None, **kw):
    settings, _ = read_command_line(text, environ=environ if environ is not None else {})
    return translate(settings, **kw)


def _why(imp) -> dict[str, tuple[str, str]]:
    return {text.split("=")[0]: (kind, why) for kind, text, why in imp.report}


# 1. lr warm-up counts training steps (verl steps its scheduler once per update_actor), and the ratio translates

def test_warmup_counts_training_steps_in_optimizer_steps():
    from hpcppo.train.optim import warmup_optimizer_steps

    # gmpo_trainer/test_dapo_7b_math.sh: 16 optimizer steps per training step; verl's 10 warm-up steps are 160 here
    assert warmup_optimizer_steps(10, 0.0, 100, 16) == 160
    assert warmup_optimizer_steps(0, 0.1, 100, 16) == 160  # int(0.1 x 100) training steps
    assert warmup_optimizer_steps(0, 0.0, 100, 16) == 0  # no warm-up stays none: existing runs unchanged


def test_warmup_ratio_translates_and_yields_to_warmup_steps():
    imp = _imp(CMD + A + "optim.lr_warmup_steps_ratio=0.05 critic.optim.lr_warmup_steps_ratio=0.1")
    assert imp.values["actor.warmup_ratio"] == 0.05 and imp.values["critic.warmup_ratio"] == 0.1
    imp = _imp(CMD + A + "optim.lr_warmup_steps=3 " + A + "optim.lr_warmup_steps_ratio=0.05")
    assert imp.values["actor.warmup_steps"] == 3 and "actor.warmup_ratio" not in imp.values
    kind, why = _why(imp)[A + "optim.lr_warmup_steps_ratio"]
    assert kind == "ignored" and "lr_warmup_steps=3" in why
    with pytest.raises(FieldValueError, match="warmup_steps or warmup_ratio, not both"):
        ActorSection(warmup_steps=2, warmup_ratio=0.1)


# 2. clip_ratio alone: verl's ActorConfig defaults clip_ratio_low/high to 0.2 and the loss reads those

def test_clip_ratio_alone_is_reported_not_applied():
    imp = _imp(CMD + A + "clip_ratio=0.3")
    assert "actor.clip_ratio" not in imp.values
    kind, why = _why(imp)[A + "clip_ratio"]
    assert kind == "ignored" and "clip_ratio_low = 0.2" in why
    imp = _imp(CMD + A + "clip_ratio=0.3 " + A + "clip_ratio_low=null " + A + "clip_ratio_high=null")
    assert imp.values["actor.clip_ratio"] == 0.3  # verl falls back to clip_ratio where low/high are null


# 3. critic.loss_agg_mode follows the actor's (${oc.select:actor_rollout_ref.actor.loss_agg_mode,token-mean})

def test_critic_loss_agg_mode_follows_the_actors():
    imp = _imp(CMD + A + "loss_agg_mode=seq-mean-token-sum algorithm.adv_estimator=gae")
    assert imp.values["critic.loss_agg_mode"] == "seq-mean-token-sum"
    imp = _imp(CMD + A + "loss_agg_mode=seq-mean-token-sum critic.loss_agg_mode=token-mean")
    assert imp.values["critic.loss_agg_mode"] == "token-mean"


# 4. shell expansions: nested defaults, environment values, arithmetic, unknowns never guessed

SCRIPT = """
RAY_DATA_HOME=${RAY_DATA_HOME:-"${HOME}/verl"}
MODEL_PATH=${MODEL_PATH:-"${RAY_DATA_HOME}/models/Qwen"}
max_response_length=$((1024 * 8))
python3 -m verl.trainer.main_ppo \\
    data.train_files=$RAY_DATA_HOME/dapo.parquet \\
    actor_rollout_ref.model.path="$MODEL_PATH" \\
    data.max_response_length=${max_response_length} \\
    trainer.nnodes=$ARNOLD_WORKER_NUM \\
    trainer.experiment_name=run-$(date +%Y%m%d)
"""


def test_nested_shell_defaults_expand_as_bash_does():
    imp = _imp(SCRIPT, environ={"HOME": "/home/u"})
    assert imp.values["data.train_files"] == ["${HOME}/verl/dapo.parquet"]  # compile expands $HOME where it runs
    assert imp.values["model.path"] == "${HOME}/verl/models/Qwen"
    assert imp.values["data.max_response_length"] == 8192
    # set in the environment: bash takes that value, not the default
    imp = _imp(SCRIPT, environ={"HOME": "/home/u", "RAY_DATA_HOME": "/lustre/me", "ARNOLD_WORKER_NUM": "2"})
    assert imp.values["data.train_files"] == ["${RAY_DATA_HOME}/dapo.parquet"]
    assert imp.values["resources.nodes"] == 2


def test_values_that_cannot_be_known_are_listed_not_guessed():
    imp = _imp(SCRIPT, environ={"HOME": "/home/u"})
    why = _why(imp)
    assert why["trainer.nnodes"][0] == "unresolved" and "$ARNOLD_WORKER_NUM" in why["trainer.nnodes"][1]
    assert why["trainer.experiment_name"][0] == "unresolved" and "$(date" in why["trainer.experiment_name"][1]
    assert "resources.nodes" not in imp.values


def test_a_variable_set_inside_if_is_not_known():
    text = 'if [ "$X" = 1 ]; then\n  N=4\nelse\n  N=8\nfi\n' + CMD + "trainer.n_gpus_per_node=$N"
    kind, why = _why(_imp(text))["trainer.n_gpus_per_node"]
    assert kind == "unresolved" and "if/fi" in why


def test_bash_arrays_and_word_split_strings_are_read():
    text = ('DATA=(\n  data.train_batch_size=64  # prompts\n  data.max_prompt_length=256\n)\n'
            'ACTOR="\n  actor_rollout_ref.actor.ppo_epochs=2\n  actor_rollout_ref.actor.entropy_coeff=0.01\n"\n'
            + CMD + '"${DATA[@]}" $ACTOR "$@"')
    settings, _ = read_command_line(text, environ={})
    assert {s.key: s.value for s in settings} == {
        "data.train_batch_size": 64, "data.max_prompt_length": 256, A + "ppo_epochs": 2, A + "entropy_coeff": 0.01}


def test_the_arnold_script_imports_without_a_traceback(tmp_path, capsys):
    script = tmp_path / "run_qwen30b_gspo.sh"
    script.write_text(CMD + "trainer.nnodes=$ARNOLD_WORKER_NUM trainer.n_gpus_per_node=$ARNOLD_WORKER_GPU "
                      "data.train_files=/d/train.parquet\n")
    assert main(["import-verl", str(script), "-o", str(tmp_path / "exp.toml")]) == 0
    err = capsys.readouterr().err
    assert "not translated [unresolved] trainer.nnodes=$ARNOLD_WORKER_NUM" in err


# 5. YAML values as OmegaConf reads them

def test_yaml_exponent_floats_are_floats():
    settings, _ = read_yaml("actor_rollout_ref:\n  actor:\n    optim:\n      lr: 3e-7\n      weight_decay: 1E-2\n"
                            "data:\n  train_batch_size: 1_024\n  prompt_key: 1e\n", "x.yaml")
    got = {s.key: s.value for s in settings}
    assert got[A + "optim.lr"] == 3e-7 and got[A + "optim.weight_decay"] == 0.01
    assert got["data.train_batch_size"] == 1024 and got["data.prompt_key"] == "1e"
    assert translate(settings).values["actor.lr"] == 3e-7


# 6. reward kwargs: the custom function's are translated; the reward manager's are reported with the right reason

def test_custom_reward_kwargs_translate(tmp_path):
    imp = _imp(CMD + f"custom_reward_function.path={tmp_path}/r.py custom_reward_function.name=score "
               "+custom_reward_function.reward_kwargs.scale=2 +custom_reward_function.reward_kwargs.mode=strict",
               cwd=tmp_path)
    assert imp.values["data.reward_fn"] == f"{tmp_path}/r.py:score"
    assert imp.values["data.reward_kwargs"] == {"scale": 2, "mode": "strict"}


def test_reward_manager_kwargs_other_than_dapos_are_unsupported_with_the_reason():
    imp = _imp(CMD + "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True "
               "+reward_model.reward_kwargs.max_resp_len=4096 +reward_model.reward_kwargs.scale=2")
    why = _why(imp)
    kind, text = why["+reward_model.reward_kwargs.scale"]
    assert kind == "unsupported" and "reward manager" in text and "overlong_buffer_cfg" in text
    assert imp.values["reward_manager.overlong_buffer.enable"] is True
    assert imp.values["reward_manager.max_resp_len"] == 4096


def test_reward_kwargs_reach_a_named_builtin_and_need_a_name():
    from hpcppo.data.rewards import build_reward_fn

    strict = build_reward_fn("math_dapo", strict_box_verify=True)
    assert strict("math", "... \\boxed{7}", "7") == 1.0
    with pytest.raises(ConfigError, match="signature"):
        build_reward_fn("math_dapo", overlong=1)
    from hpcppo.config.experiment import DataSection

    with pytest.raises(FieldValueError, match="needs a named reward_fn"):
        DataSection(train_files=["x.parquet"], reward_kwargs={"a": 1})
    assert DataSection(train_files=["x.parquet"], reward_fn="math_verify").reward_fn == "math_verify"


# 7. the watchdog: verl has no rules; the import says which it writes

def test_watchdog_rules_are_off_by_default_and_said_so(tmp_path, capsys):
    script = tmp_path / "run.sh"
    script.write_text(CMD + "data.train_files=/d/train.parquet\n")
    out = tmp_path / "exp.toml"
    assert main(["import-verl", str(script), "-o", str(out)]) == 0
    text, err = out.read_text(), capsys.readouterr().err
    assert "\n[watchdog]\nenable = true" in text and "defaults = false  # import-verl --watchdog off" in text
    assert "watchdog: hpcppo's built-in rules are off" in err
    assert main(["import-verl", str(script), "-o", str(out), "--force", "--watchdog", "defaults"]) == 0
    text, err = out.read_text(), capsys.readouterr().err
    assert "defaults = true  # import-verl --watchdog defaults" in text and "kl_rollback" in text
    assert "kl_rollback" in err


# 8. --config-name YAMLs are followed

def test_config_name_yaml_is_read_and_the_command_line_wins(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "my_multiturn.yaml").write_text(
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\ndefaults:\n  - ppo_trainer\n  - _self_\n"
        "data:\n  max_prompt_length: 1024\n  train_batch_size: 32\n")
    script = tmp_path / "run.sh"
    script.write_text('CONFIG_PATH="$(pwd)/config"\n' + CMD + '--config-path="$CONFIG_PATH" '
                      "--config-name=my_multiturn data.train_batch_size=64 data.train_files=/d/t.parquet\n")
    imp, _ = import_verl(str(script), tmp_path / "exp.toml", cwd=tmp_path, environ={})
    assert imp.values["data.max_prompt_length"] == 1024 and imp.values["trainer.train_batch_size"] == 64
    megatron = tmp_path / "m.sh"
    megatron.write_text(CMD + "--config-path=config --config-name='ppo_megatron_trainer' data.train_files=/d/t\n")
    imp, _ = import_verl(str(megatron), tmp_path / "m.toml", cwd=tmp_path, environ={})
    assert ("unsupported", "--config-name=ppo_megatron_trainer") == imp.report[0][:2]


def test_a_config_name_not_found_is_reported(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(CMD + "--config-path=/nowhere --config-name=mine data.train_files=/d/t.parquet\n")
    imp, _ = import_verl(str(script), tmp_path / "exp.toml", cwd=tmp_path, environ={})
    kind, text, why = imp.report[0]
    assert kind == "unsupported" and "--config-name=mine" in text and "not found" in why


# 9. vision-language runs are refused in one line

@pytest.mark.parametrize("setting", ["data.image_key=images",
                                     "actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-7B-Instruct",
                                     "data.train_files=$HOME/data/geo3k/train.parquet"])
def test_vision_language_scripts_are_refused(tmp_path, capsys, setting):
    script = tmp_path / "run_vl.sh"
    script.write_text(CMD + setting + "\n")
    assert main(["import-verl", str(script), "-o", str(tmp_path / "exp.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vision-language" in err and setting.split("=")[0] in err
    assert not (tmp_path / "exp.toml").exists()


def test_data_with_images_is_refused(tmp_path):
    from hpcppo.data.dataset import read_prompts

    rows = [{"data_source": "hiyouga/geometry3k", "prompt": [{"role": "user", "content": "<image> angle?"}],
             "reward_model": {"style": "rule", "ground_truth": "30"}, "images": [{"bytes": b"\x89PNG"}]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "geo.parquet")
    with pytest.raises(ConfigError, match="column\\(s\\) 'images'.*text-only"):
        read_prompts(tmp_path / "geo.parquet")


def test_an_if_with_a_known_condition_runs_its_branch_and_unknown_words_are_reported(tmp_path):
    text = ('backend=fsdp\nBASE="data.train_batch_size=8"\nif [[ $backend == megatron ]]; then\n'
            '  EXTRA="actor_rollout_ref.actor.megatron.param_offload=True"\nelif [ "$backend" = fsdp ]; then\n'
            '  EXTRA="actor_rollout_ref.actor.fsdp_config.param_offload=True"\nelse\n  EXTRA=""\nfi\n'
            'if [ "$MODE" = x ]; then MORE="data.shuffle=False"; fi\n' + CMD + "$BASE $EXTRA $MORE")
    (tmp_path / "run.sh").write_text(text)
    imp, _ = import_verl(str(tmp_path / "run.sh"), tmp_path / "exp.toml", cwd=tmp_path, environ={})
    assert imp.values["trainer.train_batch_size"] == 8 and imp.values["actor.fsdp.param_offload"] is True
    kind, why = _why(imp)["$MORE"]
    assert kind == "unresolved" and "if/fi" in why


def test_compile_refuses_a_vision_language_model(tmp_path):
    from hpcppo.config import check_experiment_paths, load_experiment

    (tmp_path / "vl").mkdir()
    (tmp_path / "vl" / "config.json").write_text(
        '{"architectures": ["Qwen2_5_VLForConditionalGeneration"], "vision_config": {"depth": 32}, '
        '"max_position_embeddings": 4096}')
    (tmp_path / "train.parquet").write_bytes(b"")
    spec = tmp_path / "exp.toml"
    spec.write_text('name = "vl"\n[model]\npath = "vl"\n[data]\ntrain_files = ["train.parquet"]\n')
    with pytest.raises(ConfigError) as err:
        check_experiment_paths(load_experiment(spec))
    text = str(err.value)
    assert "model.path" in text and "vision-language model" in text and "Qwen2_5_VL" in text
