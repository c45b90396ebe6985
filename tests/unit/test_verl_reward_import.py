"""import-verl on verl's reward-model and DAPO keys (issue 23): what translates to ``[reward_model]`` and
``[reward_manager]``, what is ignored because only speed or placement changes, and what is refused in one line. The
command lines are the reward keys of verl b178a3c's examples (examples/ppo_trainer/run_qwen2.5-3b_rm_legacy.sh,
run_qwen2-7b_rm.sh, examples/gmpo_trainer/test_dapo_7b_math.sh)."""

from __future__ import annotations

from hpcppo.verl.importer import translate
from hpcppo.verl.read import read_command_line

CMD = "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=/m data.train_files=/d.parquet "


def _imp(text: str, tmp_path):
    settings, _ = read_command_line(CMD + text, environ={})
    return translate(settings, cwd=tmp_path)


def _why(imp) -> dict[str, tuple[str, str]]:
    return {text.split("=")[0]: (kind, why) for kind, text, why in imp.report}


def test_the_legacy_workers_keys_translate(tmp_path):
    imp = _imp("reward_model.enable=True reward_model.model.path=/rm reward_model.use_reward_loop=False "
               "reward_model.model.use_remove_padding=True reward_model.model.fsdp_config.param_offload=True "
               "reward_model.micro_batch_size_per_gpu=32 reward_model.max_length=4096", tmp_path)
    v = imp.values
    assert (v["reward_model.enable"], v["reward_model.path"], v["reward_model.offload"]) == (True, "/rm", True)
    assert (v["reward_model.micro_batch_size_per_gpu"], v["reward_model.max_length"]) == (32, 4096)
    why = _why(imp)
    assert why["reward_model.use_reward_loop"][0] == "ignored" and "same last-token score" in why[
        "reward_model.use_reward_loop"][1]
    assert why["reward_model.model.use_remove_padding"][0] == "ignored"


def test_the_reward_loops_server_settings_are_ignored_with_the_reason(tmp_path):
    imp = _imp("reward_model.enable=True reward_model.model.path=/rm reward_model.use_reward_loop=True "
               "reward_model.rollout.name=vllm reward_model.rollout.gpu_memory_utilization=0.8 "
               "reward_model.num_workers=8 reward_model.use_dynamic_bsz=True "
               "reward_model.forward_max_token_len_per_gpu=9000 reward_model.micro_batch_size=16 "
               "trainer.n_gpus_per_node=8", tmp_path)
    why = _why(imp)
    assert all(why[k][0] == "ignored" for k in ("reward_model.rollout.name", "reward_model.num_workers",
                                                 "reward_model.rollout.gpu_memory_utilization"))
    assert "FSDP2" in why["reward_model.rollout.name"][1]
    assert imp.values["reward_model.max_tokens_per_micro_batch"] == 9000
    assert imp.values["reward_model.micro_batch_size_per_gpu"] == 2  # 16 over 8 GPUs


def test_dapo_and_its_overlong_buffer_translate(tmp_path):
    imp = _imp("reward_model.reward_manager=dapo +reward_model.reward_kwargs.overlong_buffer_cfg.enable=True "
               "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4096 "
               "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 "
               "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False "
               "+reward_model.reward_kwargs.max_resp_len=8192 data.max_response_length=8192", tmp_path)
    v = imp.values
    assert v["reward_manager.name"] == "dapo" and v["reward_manager.max_resp_len"] == 8192
    assert (v["reward_manager.overlong_buffer.enable"], v["reward_manager.overlong_buffer.len"],
            v["reward_manager.overlong_buffer.penalty_factor"], v["reward_manager.overlong_buffer.log"]) == (
        True, 4096, 1.0, False)
    assert _imp("reward_manager.name=dapo", tmp_path).values["reward_manager.name"] == "dapo"


def test_what_cannot_be_honoured_is_refused_in_one_line(tmp_path):
    imp = _imp("reward_model.reward_manager=prime reward_manager.name=batch reward_model.enable_resource_pool=True "
               "reward_model.enable=True reward_model.model.path=/rm reward_model.use_reward_loop=False "
               "reward_model.model.input_tokenizer=null reward_model.ulysses_sequence_parallel_size=2 "
               "reward_model.sandbox_fusion.url=http://x +reward_model.truncation=left", tmp_path)
    why = _why(imp)
    for key, words in (("reward_model.reward_manager", "prime reward manager is not in hpcppo"),
                       ("reward_manager.name", "batch reward manager is not in hpcppo"),
                       ("reward_model.enable_resource_pool", "colocates"),
                       ("reward_model.model.input_tokenizer", "always re-templates"),
                       ("reward_model.ulysses_sequence_parallel_size", "sequence parallelism"),
                       ("reward_model.sandbox_fusion.url", "sandbox"),
                       ("+reward_model.truncation", "from the right")):
        kind, text = why[key]
        assert kind == "unsupported" and words in text and "\n" not in text, (key, why[key])
    assert "reward_manager.name" not in imp.values


def test_input_tokenizer_is_verls_default_re_templating_unless_null_with_the_legacy_worker(tmp_path):
    why = _why(_imp("reward_model.model.input_tokenizer=/m reward_model.use_reward_loop=False", tmp_path))
    assert why["reward_model.model.input_tokenizer"][0] == "ignored"
    why = _why(_imp("reward_model.model.input_tokenizer=null", tmp_path))  # the reward loop never reads it
    assert why["reward_model.model.input_tokenizer"][0] == "ignored"


def test_a_hub_id_as_the_reward_model_path_is_pointed_out(tmp_path):
    imp = _imp("reward_model.enable=True reward_model.model.path=sfairXC/FsfairX-LLaMA3-RM-v0.1", tmp_path)
    assert any("reward_model.model.path: sfairXC/FsfairX-LLaMA3-RM-v0.1 looks like a Hugging Face hub id" in n
               for n in imp.notes)
