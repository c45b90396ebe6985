"""``hpcppo import-verl``: verl command lines and YAML in, an annotated exp.toml out that compiles, every setting
either translated (with a comment naming it) or reported with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.config import load_resolved
from hpcppo.verl import names as verl
from hpcppo.config.experiment import Experiment
from hpcppo.config.load import leaf_keys
from hpcppo.verl.importer import read_command_line, read_yaml, translate

REPO = Path(__file__).resolve().parents[2]
INPUTS = Path(__file__).resolve().parent / "verl_inputs"
EXAMPLE = REPO / "examples" / "verl-gsm8k.sh"

# The keys issue 10 lists (item 1), each of which the table must know.
ISSUE_KEYS = [
    "data.train_files", "data.val_files", "data.train_batch_size", "data.max_prompt_length", "data.max_response_length",
    "data.truncation", "data.filter_overlong_prompts", "actor_rollout_ref.model.path",
    "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.actor.ppo_epochs",
    "actor_rollout_ref.actor.clip_ratio", "actor_rollout_ref.actor.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high", "actor_rollout_ref.actor.clip_ratio_c",
    "actor_rollout_ref.actor.loss_agg_mode", "actor_rollout_ref.actor.entropy_coeff",
    "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.kl_loss_type",
    "actor_rollout_ref.actor.fsdp_config.param_offload", "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
    "actor_rollout_ref.ref.fsdp_config.param_offload", "actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.rollout.top_p",
    "actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "critic.optim.lr", "critic.model.path",
    "critic.ppo_micro_batch_size_per_gpu", "critic.ppo_mini_batch_size", "critic.ppo_epochs", "critic.cliprange_value",
    "critic.model.fsdp_config.param_offload", "algorithm.adv_estimator", "algorithm.gamma", "algorithm.lam",
    "algorithm.use_kl_in_reward", "algorithm.kl_penalty", "algorithm.kl_ctrl.type", "algorithm.kl_ctrl.kl_coef",
    "algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.target_kl", "trainer.total_epochs", "trainer.save_freq",
    "trainer.test_freq", "trainer.nnodes", "trainer.n_gpus_per_node", "custom_reward_function.path",
    "custom_reward_function.name",
]


def run_cli(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The installed entry point in a fresh interpreter, as a user runs it."""
    code = "import sys; from hpcppo.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {k: v for k, v in os.environ.items() if k != "HPCPPO_RUNS_ROOT"}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, input=stdin,
                          env=env, timeout=120)


def _spec_lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if ln and not ln.startswith(("#", "["))]


# ------------------------------------------------------------------------------------------------ the table

def test_every_key_the_issue_lists_is_mapped_to_a_real_hpcppo_key():
    leaves = set(leaf_keys(Experiment)) | {"name", "seed"}
    for key in ISSUE_KEYS:
        entry = verl.lookup(key)
        assert entry is not None and entry.kind == verl.MAP, key
        assert entry.hpcppo in leaves, (key, entry.hpcppo)


def test_every_entry_points_at_a_real_key_or_gives_a_reason():
    leaves = set(leaf_keys(Experiment))
    for e in verl.ENTRIES:
        if e.kind in (verl.MAP, verl.NOT_VERL):
            assert e.hpcppo in leaves, e
        else:
            assert e.note and not e.hpcppo, e  # ignored or unsupported: always with the reason
    kinds = {e.verl: e.kind for e in verl.ENTRIES}
    assert kinds["actor_rollout_ref.actor.use_dual_clip"] == verl.NOT_VERL
    assert verl.lookup("actor_rollout_ref.actor.use_dual_clip").hpcppo == "actor.clip_ratio_c"
    assert verl.lookup("critic.vf_clip_param").hpcppo == "critic.cliprange_value"
    assert kinds["actor_rollout_ref.actor.fsdp_config.forward_prefetch"] == verl.IGNORED
    assert "FSDP1" in verl.lookup("actor_rollout_ref.actor.fsdp_config.forward_prefetch").note


def test_prefix_entries_cover_nested_keys_and_exact_entries_win():
    assert verl.lookup("actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space").kind == verl.IGNORED
    assert verl.lookup("actor_rollout_ref.actor.checkpoint.async_save").hpcppo == "checkpoint.async_save"
    assert verl.lookup("actor_rollout_ref.actor.checkpoint.save_contents").kind == verl.IGNORED
    assert verl.lookup("+actor_rollout_ref.actor.clip_ratio").hpcppo == "actor.clip_ratio"
    assert verl.lookup("no_such.key") is None


def test_hydra_values_parse_as_hydra_reads_them():
    assert verl.parse_value("1e-6") == 1e-6 and verl.parse_value("True") is True and verl.parse_value("null") is None
    assert verl.parse_value("['a.parquet', \"b.parquet\"]") == ["a.parquet", "b.parquet"]
    assert verl.parse_value("[console,wandb]") == ["console", "wandb"] and verl.parse_value("{}") == {}
    assert verl.parse_value("-1") == -1 and verl.parse_value("'error'") == "error"


# ------------------------------------------------------------------------------------------------ value translation

def _translated(*tokens: str, **kw):
    settings, _ = read_command_line("python3 -m verl.trainer.main_ppo " + " ".join(tokens))
    return translate(settings, **kw)


def test_value_translations_follow_verl_semantics(tmp_path):
    imp = _translated("trainer.save_freq=0", "trainer.test_freq=-1", "trainer.nnodes=2", "trainer.n_gpus_per_node=8",
                      "actor_rollout_ref.actor.ppo_micro_batch_size=64", "trainer.resume_mode=disable",
                      "trainer.experiment_name='my run/v2'", "actor_rollout_ref.actor.fsdp_config.fsdp_size=8",
                      "actor_rollout_ref.rollout.val_kwargs.temperature=0.6",
                      "actor_rollout_ref.rollout.top_k=0", "trainer.critic_warmup=5", cwd=tmp_path)
    v = imp.values
    assert v["checkpoint.save_every"] == -1  # verl saves only when save_freq > 0: 0 is never, not "at the end"
    assert v["trainer.test_freq"] == -1
    assert v["actor.ppo_micro_batch_size_per_gpu"] == 4  # 64 over 2 x 8 GPUs, as fsdp_workers.py divides it
    assert v["checkpoint.resume"] == "never" and v["name"] == "my-run-v2" and v["resources.hsdp"] == "on"
    # verl: the actor trains once critic_warmup <= global_steps (from 1): 4 critic-only steps, hpcppo's warmup_updates
    assert v["critic.warmup_updates"] == 4
    assert v["rollout.val_temperature"] == 0.6 and v["rollout.top_k"] == -1  # verl's 0 is "off" as -1 is


def test_a_global_micro_batch_that_does_not_divide_is_reported_not_guessed(tmp_path):
    imp = _translated("actor_rollout_ref.actor.ppo_micro_batch_size=60", "trainer.n_gpus_per_node=8", cwd=tmp_path)
    assert "actor.ppo_micro_batch_size_per_gpu" not in imp.values
    [(kind, text, why)] = [r for r in imp.report if "ppo_micro_batch_size=60" in r[1]]
    assert kind == "unsupported" and "60 samples over 8 GPUs" in why


def test_the_custom_reward_function_becomes_data_reward_fn(tmp_path):
    imp = _translated("custom_reward_function.path=rewards/r.py", "custom_reward_function.name=my_score", cwd=tmp_path)
    assert imp.values["data.reward_fn"] == f"{tmp_path / 'rewards' / 'r.py'}:my_score"
    assert len(imp.comments["data.reward_fn"]) == 2 and not imp.report
    imp = _translated("custom_reward_function.path=/abs/r.py", cwd=tmp_path)
    assert imp.values["data.reward_fn"] == "/abs/r.py:compute_score"  # verl's default name


def test_values_are_checked_against_the_schema_before_they_are_written(tmp_path):
    imp = _translated("actor_rollout_ref.actor.clip_ratio_c=0.5", "algorithm.adv_estimator=grpo_vectorized",
                      "actor_rollout_ref.rollout.name=sglang", cwd=tmp_path)
    for key in ("actor.clip_ratio_c", "algorithm.adv_estimator", "rollout.engine"):
        assert key not in imp.values
    reasons = {text.split("=")[0]: why for _, text, why in imp.report}
    assert "must be > 1" in reasons["actor_rollout_ref.actor.clip_ratio_c"] or "> 1.0" in reasons[
        "actor_rollout_ref.actor.clip_ratio_c"]
    assert "gae" in reasons["algorithm.adv_estimator"]  # the allowed values are named
    assert "use vllm" in reasons["actor_rollout_ref.rollout.name"]


def test_nothing_is_dropped_silently(tmp_path):
    tokens = ["actor_rollout_ref.actor.use_dual_clip=True", "critic.vf_clip_param=0.2",
              "actor_rollout_ref.actor.fsdp_config.forward_prefetch=True", "reward_model.enable_resource_pool=True",
              "actor_rollout_ref.actor.use_dynamic_bsz=False", "totally.unknown=3", "trainer.logger=[console]",
              "actor_rollout_ref.actor.clip_ratio=0.25", "data.max_prompt_length=300",
              "actor_rollout_ref.rollout.prompt_length=256"]
    imp = _translated(*tokens, cwd=tmp_path)
    translated = {s.text for s in imp.sources.values() if not s.default}
    accounted = translated | {text for _, text, _ in imp.report}
    assert accounted == set(tokens)
    kinds = {text.split("=")[0]: kind for kind, text, _ in imp.report}
    assert kinds == {"actor_rollout_ref.actor.use_dual_clip": "not-verl", "critic.vf_clip_param": "not-verl",
                     "actor_rollout_ref.actor.fsdp_config.forward_prefetch": "ignored",
                     "reward_model.enable_resource_pool": "unsupported", "actor_rollout_ref.actor.use_dynamic_bsz": "ignored",
                     "totally.unknown": "unknown",
                     "actor_rollout_ref.rollout.prompt_length": "conflict",
                     "actor_rollout_ref.actor.clip_ratio": "ignored"}
    why = {text.split("=")[0]: w for _, text, w in imp.report}
    assert "clip_ratio_c" in why["actor_rollout_ref.actor.use_dual_clip"]
    assert "critic.cliprange_value" in why["critic.vf_clip_param"]


def test_verl_defaults_are_written_where_hpcppo_differs(tmp_path):
    imp = _translated("actor_rollout_ref.model.path=/m", "data.train_files=/d.parquet", cwd=tmp_path)
    assert imp.values["trainer.train_batch_size"] == 1024 and imp.values["trainer.total_epochs"] == 30
    assert imp.values["model.gradient_checkpointing"] is True and imp.values["rollout.tensor_parallel_size"] == 2
    assert imp.comments["trainer.total_epochs"] == ["verl's default trainer.total_epochs=30 (not in the input)"]
    assert "trainer.val_before_train" not in imp.values  # no validation files: nothing to validate on
    assert "resources.hsdp" not in imp.values  # one node: hsdp is off anyway
    assert any("rollout.name is not given" in n for n in imp.notes)


# ------------------------------------------------------------------------------------------------ reading

def test_a_pasted_script_is_read_as_the_shell_would_pass_it():
    text = ("set -x\nexport DATA=/lustre/gsm8k\nMODEL=\"/models/qwen 7b\"\nlr=3e-6\n"
            "PYTHONUNBUFFERED=1 python3 -m verl.trainer.main_ppo \\\n"
            "   data.train_files=\"['$DATA/train.parquet', '$DATA/extra.parquet']\" \\\n"
            "   actor_rollout_ref.model.path=\"$MODEL\" \\\n"
            "   +actor_rollout_ref.actor.optim.lr=${lr} data.prompt_key=${KEY:-question} \\\n"
            "   data.val_files=$HOME/test.parquet \\\n"
            "   --config-name=ppo_megatron_trainer \\\n"
            "   ~trainer.logger \\\n"
            "   trainer.total_epochs=2 $@ 2>&1 | tee log.txt\n"
            "    trainer.nnodes=2\n"
            "python3 -m verl.trainer.main_ppo trainer.total_epochs=9\n")
    settings, notes = read_command_line(text, environ={"HOME": "/home/u"})
    got = {s.key: s.value for s in settings}
    assert got == {"data.train_files": ["/lustre/gsm8k/train.parquet", "/lustre/gsm8k/extra.parquet"],
                   "actor_rollout_ref.model.path": "/models/qwen 7b", "actor_rollout_ref.actor.optim.lr": 3e-6,
                   "data.val_files": "/home/u/test.parquet", "trainer.total_epochs": 2, "data.prompt_key": "question"}
    # the environment's $HOME stays a variable in the portable form (compile expands it where it runs)
    assert {s.key: s.portable for s in settings}["data.val_files"] == "${HOME}/test.parquet"
    joined = "\n".join(notes)
    for part in ("PYTHONUNBUFFERED=1", "--config-name=ppo_megatron_trainer", "~trainer.logger", "$@",
                 "a second verl command", "trainer.nnodes=2 is outside the verl command"):
        assert part in joined, part


def test_a_bare_list_of_overrides_is_read_too():
    settings, _ = read_command_line("data.train_batch_size=64\ntrainer.nnodes=1 trainer.n_gpus_per_node=4\n")
    assert [(s.key, s.value) for s in settings] == [("data.train_batch_size", 64), ("trainer.nnodes", 1),
                                                    ("trainer.n_gpus_per_node", 4)]


def test_a_nested_yaml_is_flattened_and_hydra_parts_are_reported():
    settings, notes = read_yaml((INPUTS / "grpo.yaml").read_text(), "grpo.yaml")
    got = {s.key: s.value for s in settings}
    assert got["actor_rollout_ref.actor.clip_ratio_high"] == 0.28 and got["data.truncation"] == "middle"
    assert got["data.train_files"] == ["data/a.parquet", "data/b.parquet"]
    # defaults: [ppo_trainer, _self_] is verl's base config, the one every import starts from: nothing to report
    assert not any("defaults" in n for n in notes), notes


# ------------------------------------------------------------------------------------------------ end to end

def test_the_gsm8k_example_imports_and_compiles_on_a100_cluster(tmp_path):
    out = tmp_path / "gsm8k.toml"
    r = run_cli("import-verl", str(EXAMPLE), "-o", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stderr and "[ignored] trainer.logger" not in r.stderr
    assert "hpcppo: warning: actor_rollout_ref.model.path: Qwen/Qwen2.5-7B looks like a Hugging Face hub id" in r.stderr
    assert "hpcppo: warning: data.train_files: ${HOME}/data/gsm8k/train.parquet left as written" in r.stderr
    # Every translated line names the verl setting it came from.
    lines = _spec_lines(out)
    assert lines and all("  # from verl " in ln or "  # verl's default " in ln or "  # import-verl --watchdog off: " in ln
                         for ln in lines), lines
    assert 'clip_ratio_c = 3.0  # from verl actor_rollout_ref.actor.clip_ratio_c=3.0' in lines
    # verl's trackers: wandb (offline here) beside the HDF5 log, under the script's project
    assert 'logger = ["console", "wandb"]  # from verl trainer.logger=["console","wandb"]' in lines
    assert any(ln.startswith('project_name = "verl_example_gsm8k"') for ln in lines), lines
    # The model and the data live on the cluster ($HOME there, a downloaded Qwen2.5-7B): --no-check-paths, as on a
    # login node that cannot see them.
    runs = tmp_path / "runs"
    r = run_cli("compile", str(out), "--site", "a100-cluster", "--no-check-paths", "-q", "--runs-root", str(runs),
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    [run_dir] = runs.iterdir()
    c = load_resolved(run_dir / "resolved.toml")
    assert (c.plan.world_size, c.plan.nodes, c.plan.tensor_parallel_size) == (8, 1, 4)
    e = c.experiment
    assert (e.trainer.train_batch_size, e.actor.ppo_mini_batch_size, e.actor.ppo_micro_batch_size_per_gpu) == (1024, 256, 16)
    assert (e.rollout.engine, e.rollout.micro_batch_size_per_gpu, e.critic.ppo_micro_batch_size_per_gpu) == ("vllm", 32, 32)
    assert e.reference.offload and e.model.gradient_checkpointing and e.data.filter_overlong_prompts
    assert (e.checkpoint.save_every, e.trainer.test_freq, e.trainer.total_epochs) == (20, 1, 15)
    assert e.data.train_files == [os.path.expandvars("$HOME/data/gsm8k/train.parquet")]
    assert c.plan.needs_critic and e.name == "qwen2.5_7b_gsm8k_ppo"


def test_the_pasted_quickstart_and_the_yaml_fixture_compile(tmp_path):
    for name, site in (("quickstart.txt", "a100-cluster"), ("grpo.yaml", "a100-cluster")):
        out = tmp_path / f"{name}.toml"
        r = run_cli("import-verl", str(INPUTS / name), "-o", str(out), cwd=tmp_path)
        assert r.returncode == 0 and "does not load" not in r.stderr, r.stderr
        r = run_cli("compile", str(out), "--site", site, "--no-check-paths", "-q", "--runs-root",
                    str(tmp_path / "runs"), cwd=tmp_path)
        assert r.returncode == 0, (name, r.stderr)
    spec = tomllib.loads((tmp_path / "grpo.yaml.toml").read_text())
    assert spec["resources"] == {"nodes": 2, "gpus_per_node": 8, "hsdp": "off"}
    assert spec["actor"]["ppo_micro_batch_size_per_gpu"] == 1  # verl's global 16 over 2 x 8 GPUs


def test_stdin_force_and_unreadable_input(tmp_path):
    out = tmp_path / "exp.toml"
    r = run_cli("import-verl", "-", "-o", str(out), cwd=tmp_path,
                stdin="python3 -m verl.trainer.main_ppo data.train_files=d.parquet actor_rollout_ref.model.path=/m\n")
    assert r.returncode == 0 and out.is_file(), r.stderr
    before = out.read_text()
    r = run_cli("import-verl", str(EXAMPLE), "-o", str(out), cwd=tmp_path)
    assert r.returncode == 5 and r.stderr.count("\n") == 1 and "pass --force" in r.stderr
    assert out.read_text() == before  # refused: untouched
    r = run_cli("import-verl", str(EXAMPLE), "-o", str(out), "--force", cwd=tmp_path)
    assert r.returncode == 0 and out.read_text() != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.toml"]  # written in place, no temporary left
    r = run_cli("import-verl", str(tmp_path / "missing.sh"), "-o", str(tmp_path / "x.toml"), cwd=tmp_path)
    assert r.returncode == 5 and "missing.sh: no such file" in r.stderr and r.stderr.count("\n") == 1
    r = run_cli("import-verl", str(EXAMPLE), "-o", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 5 and "is a directory" in r.stderr and r.stderr.count("\n") == 1
    (tmp_path / "a-file").write_text("")
    r = run_cli("import-verl", str(EXAMPLE), "-o", str(tmp_path / "a-file" / "x.toml"), cwd=tmp_path)
    assert r.returncode == 5 and "x.toml cannot be written" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    (tmp_path / "a-file").unlink()
    (tmp_path / "empty.sh").write_text("echo nothing here\n")
    r = run_cli("import-verl", str(tmp_path / "empty.sh"), "-o", str(tmp_path / "x.toml"), cwd=tmp_path)
    assert r.returncode == 2 and "no verl settings found" in r.stderr and not (tmp_path / "x.toml").exists()
    (tmp_path / "bad.yaml").write_text("data: [unclosed\n")
    r = run_cli("import-verl", str(tmp_path / "bad.yaml"), "-o", str(tmp_path / "x.toml"), cwd=tmp_path)
    assert r.returncode == 2 and "bad.yaml: not valid YAML" in r.stderr and r.stderr.count("\n") == 1


def test_relative_paths_stay_right_when_the_spec_is_written_elsewhere(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.parquet").write_bytes(b"")
    sub = tmp_path / "specs" / "gsm8k"
    sub.mkdir(parents=True)
    settings, _ = read_command_line("python3 -m verl.trainer.main_ppo data.train_files=data/train.parquet")
    imp = translate(settings, cwd=tmp_path, out_dir=sub)
    [rel] = imp.values["data.train_files"]
    assert (sub / rel).resolve() == (tmp_path / "data" / "train.parquet").resolve()


def test_table_flag_prints_the_doc(capsys):
    assert main(["import-verl", "--table"]) == 0
    out = capsys.readouterr().out
    assert "| `actor_rollout_ref.actor.clip_ratio` | `actor.clip_ratio` |" in out


@pytest.mark.parametrize("key", ["actor_rollout_ref.actor.use_dual_clip", "critic.vf_clip_param"])
def test_keys_verl_does_not_have_name_the_right_one(key):
    text = verl.hint(key)
    assert text is not None and "not a verl key" in text and verl.lookup(key).hpcppo in text


def test_the_table_knows_every_key_of_verls_own_config():
    """verl's composed PPO configs (FSDP and Megatron), key by key: each is mapped, ignored or refused with a reason,
    so that importing any verl config leaves no key unexplained."""
    keys = [ln for ln in (INPUTS / "ppo_trainer_keys.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert len(keys) > 700
    unknown = [k for k in keys if verl.lookup(k) is None]
    assert unknown == []


def _gsm8k_rows(n: int) -> list[dict]:
    """Rows in the schema verl's examples/data_preprocess/gsm8k.py writes."""
    return [{"data_source": "openai/gsm8k",
             "prompt": [{"role": "user", "content": f"{i} + {i + 1} = ? Let's think step by step and output the final "
                                                    "answer after \"####\"."}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * i + 1)},
             "extra_info": {"split": "train", "index": i}} for i in range(n)]


def test_the_gsm8k_example_compiles_with_its_data_and_model_checked(tmp_path, random_tiny):
    """With the paths present (the model downloaded next to the spec under its hub id, GSM8K under $HOME as verl's
    preprocessing writes it), compile checks them too: the data's schema, the scorer of openai/gsm8k, the prompt
    lengths with the local tokenizer, a batch of 1024 prompts."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(random_tiny["model"], tmp_path / "Qwen" / "Qwen2.5-7B")
    config = tmp_path / "Qwen" / "Qwen2.5-7B" / "config.json"  # Qwen2.5-7B's positions, which the spec's lengths fit
    config.write_text(json.dumps({**json.loads(config.read_text()), "max_position_embeddings": 131072}))
    home = tmp_path / "home"
    (home / "data" / "gsm8k").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(_gsm8k_rows(1100)), home / "data" / "gsm8k" / "train.parquet")
    pq.write_table(pa.Table.from_pylist(_gsm8k_rows(40)), home / "data" / "gsm8k" / "test.parquet")
    out = tmp_path / "exp.toml"
    env_home = {"HOME": str(home)}
    code = "import sys; from hpcppo.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**{k: v for k, v in os.environ.items() if k != "HPCPPO_RUNS_ROOT"}, **env_home}
    r = subprocess.run([sys.executable, "-c", code, "import-verl", str(EXAMPLE), "-o", str(out)], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "looks like a Hugging Face hub id" not in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-c", code, "compile", str(out), "--site", "a100-cluster", "-q", "--runs-root",
                        str(tmp_path / "runs")], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    # The same spec with one prompt too few for verl's batch of 1024 is refused at compile, before any queue.
    pq.write_table(pa.Table.from_pylist(_gsm8k_rows(1000)), home / "data" / "gsm8k" / "train.parquet")
    r = subprocess.run([sys.executable, "-c", code, "compile", str(out), "--site", "a100-cluster", "-q", "--runs-root",
                        str(tmp_path / "runs")], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "trainer.train_batch_size" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_a_spec_that_does_not_load_is_written_and_the_problem_named(tmp_path):
    """Each value is checked alone before it is written; what only the whole spec shows (no training file at all)
    is named after writing, so the user edits one file instead of re-running the import."""
    r = run_cli("import-verl", "-", "-o", str(tmp_path / "exp.toml"), cwd=tmp_path,
                stdin="python3 -m verl.trainer.main_ppo data.train_files=[] actor_rollout_ref.model.path=/m\n")
    assert r.returncode == 0 and (tmp_path / "exp.toml").is_file()
    last = r.stderr.splitlines()[-1]
    assert last.startswith("hpcppo: error: ") and "does not load yet" in last and "train_files" in last


def test_verls_optimal_token_baseline_example_imports_with_nothing_unsupported(tmp_path):
    """verl's examples/otb_trainer/run_qwen2_5-7b.sh asks for calculate_sum_pi_squared: hpcppo computes it for the
    estimator anyway (issue 33), so the key is reported as ignored, not refused."""
    imp = _translated("algorithm.adv_estimator=optimal_token_baseline", "actor_rollout_ref.rollout.n=8",
                      "actor_rollout_ref.actor.calculate_sum_pi_squared=True",
                      "actor_rollout_ref.actor.sum_pi_squared_checkpointing=True", cwd=tmp_path)
    assert imp.values["algorithm.adv_estimator"] == "optimal_token_baseline"
    kinds = {text.split("=")[0]: kind for kind, text, _ in imp.report}
    assert kinds["actor_rollout_ref.actor.calculate_sum_pi_squared"] == "ignored"
    assert kinds["actor_rollout_ref.actor.sum_pi_squared_checkpointing"] == "ignored"
    assert "unsupported" not in kinds.values()
