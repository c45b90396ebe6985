"""``[reward_model]`` and ``[reward_manager]`` at compile (issue 23): what the login node can check about the reward
model's directory (a one-label classification model, a tokenizer with a chat template), the settings that could not
all take effect, the memory the reward model adds to ``hpcppo plan``, and the example spec."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from hpcppo.compiler import compile_config
from hpcppo.errors import HpcppoError

REPO = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path, tiny: dict[str, Path], extra: str) -> Path:
    spec = tmp_path / "exp.toml"
    spec.write_text(textwrap.dedent(f"""\
        name = "rm"
        [model]
        path = "{tiny['model']}"
        dtype = "float32"
        [data]
        train_files = ["{tiny['train']}"]
        val_files = ["{tiny['val']}"]
        max_prompt_length = 48
        max_response_length = 8
        [rollout]
        n = 2
        [trainer]
        train_batch_size = 8
        total_steps = 2
        [actor]
        ppo_mini_batch_size = 8
        ppo_micro_batch_size_per_gpu = 4
        [critic]
        ppo_micro_batch_size_per_gpu = 4
        """) + textwrap.dedent(extra))
    return spec


def _error(spec: Path) -> str:
    with pytest.raises(HpcppoError) as info:
        compile_config(spec, "local")
    text = str(info.value)
    assert "\n" not in text.strip() and "Traceback" not in text
    return text


def test_a_reward_model_directory_compiles_and_is_counted_in_the_plan(tmp_path, random_tiny, random_tiny_rm):
    from hpcppo.sizing.estimate import estimate

    spec = _spec(tmp_path, random_tiny, f'[reward_model]\nenable = true\npath = "{random_tiny_rm}"\noffload = false\n')
    compiled = compile_config(spec, "local")
    assert compiled.experiment.reward_model.path == str(random_tiny_rm)
    budget = estimate(compiled.site, compiled.experiment, compiled.plan)
    names = [p.name for p in budget.phases]
    assert "reward model" in names
    items = {i.what for p in budget.phases for i in p.items}
    assert "reward model params (fp32 shard)" in items
    off = estimate(compiled.site, compile_config(spec, "local", ["reward_model.offload=true"]).experiment,
                   compiled.plan)
    assert "reward model params (fp32 shard)" not in {i.what for p in off.phases for i in p.items}
    assert off.host["shards_on_host_bytes"] == budget.host["shards_on_host_bytes"]  # CPU ranks hold them anyway
    assert "reward model" not in [p.name for p in estimate(compiled.site, compile_config(
        spec, "local", ["reward_model.enable=false"]).experiment, compiled.plan).phases]


def _copy(src: Path, dst: Path, edit_config=None, edit_tokenizer=None) -> Path:
    shutil.copytree(src, dst)
    for name, edit in (("config.json", edit_config), ("tokenizer_config.json", edit_tokenizer)):
        if edit:
            data = json.loads((dst / name).read_text())
            edit(data)
            (dst / name).write_text(json.dumps(data))
    return dst


@pytest.mark.parametrize("case, expect", [
    ("missing", "reward_model.path: {p} does not exist"),
    ("positions", "reward_model.max_length: 100 tokens, more than the reward model's max_position_embeddings = 64"),
    ("causal", "ForSequenceClassification"),
    ("two_labels", "has 2 labels; allowed: 1"),
    ("no_template", "no chat template"),
    ("no_tokenizer", "has no tokenizer"),
    ("classifier", "the checkpoint has no score.weight (top-level tensors: classifier)"),
    ("classifier_index", "the checkpoint has no score.weight (top-level tensors: classifier)"),
])
def test_a_bad_reward_model_directory_is_refused_in_one_line(tmp_path, random_tiny, random_tiny_rm, case, expect):
    path = tmp_path / "rm"
    if case == "causal":
        path = random_tiny["model"]
    elif case == "two_labels":
        _copy(random_tiny_rm, path, edit_config=lambda c: c.update(id2label={"0": "a", "1": "b"}))
    elif case == "no_template":
        _copy(random_tiny_rm, path, edit_tokenizer=lambda t: t.pop("chat_template", None))
        (path / "chat_template.jinja").unlink(missing_ok=True)
    elif case == "positions":
        path = random_tiny_rm
    elif case == "no_tokenizer":
        _copy(random_tiny_rm, path)
        (path / "tokenizer.json").unlink()
    elif case.startswith("classifier"):  # an encoder's head name (BERT, RoBERTa ...): read from the file's header
        from safetensors.torch import load_file, save_file

        _copy(random_tiny_rm, path)
        tensors = {k.replace("score.", "classifier.", 1): v for k, v in load_file(path / "model.safetensors").items()}
        if case == "classifier_index":  # a sharded checkpoint: the index's weight_map
            (path / "model.safetensors").unlink()
            save_file(tensors, path / "model-00001-of-00001.safetensors")
            (path / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {}, "weight_map": {k: "model-00001-of-00001.safetensors" for k in tensors}}))
        else:
            save_file(tensors, path / "model.safetensors")
    extra = "max_length = 100\n" if case == "positions" else ""
    text = _error(_spec(tmp_path, random_tiny, f'[reward_model]\nenable = true\npath = "{path}"\n{extra}'))
    assert expect.format(p=path) in text


@pytest.mark.parametrize("extra, expect", [
    ("[reward_model]\nenable = true\n", "reward_model.path: is empty but enable is true"),
    ('[reward_model]\nenable = true\npath = "{rm}"\n[reward_manager]\nname = "dapo"\n',
     "reward_manager.name: 'dapo' with reward_model.enable"),
    ("[reward_manager.overlong_buffer]\nenable = true\nlen = 2\n", "overlong_buffer: is enabled but name is 'naive'"),
    ('[reward_manager]\nname = "dapo"\n[reward_manager.overlong_buffer]\nenable = true\nlen = 9\n',
     "reward_manager.overlong_buffer.len: 9 is longer than max_resp_len 8"),
    ('[reward_manager]\nname = "dapo"\nmax_resp_len = 4\n[reward_manager.overlong_buffer]\nenable = true\nlen = 6\n',
     "reward_manager.overlong_buffer.len: 6 is longer than max_resp_len 4"),
    ('[reward_manager]\nname = "dapo"\n[reward_manager.overlong_buffer]\nenable = true\n', "len: must be at least 1"),
    ('[reward_manager]\nname = "prime"\n', "reward_manager.name"),
])
def test_settings_that_cannot_all_take_effect_are_refused(tmp_path, random_tiny, random_tiny_rm, extra, expect):
    text = _error(_spec(tmp_path, random_tiny, extra.replace("{rm}", str(random_tiny_rm))))
    assert expect in text and "exp.toml" in text


def test_dapo_with_the_buffer_compiles(tmp_path, random_tiny):
    spec = _spec(tmp_path, random_tiny, '[reward_manager]\nname = "dapo"\n[reward_manager.overlong_buffer]\n'
                                        'enable = true\nlen = 4\npenalty_factor = 0.5\nlog = true\n')
    rm = compile_config(spec, "local").experiment.reward_manager
    assert (rm.name, rm.overlong_buffer.len, rm.overlong_buffer.penalty_factor) == ("dapo", 4, 0.5)


def test_the_reward_model_example_compiles():
    compiled = compile_config(REPO / "examples" / "arith-tiny-rm.toml", "local", check_paths=False)
    rm = compiled.experiment.reward_model
    assert rm.enable and rm.path.endswith("artifacts/tiny-arith/reward-model")
    assert compiled.experiment.reward_manager.name == "naive"


def test_with_a_reward_model_training_rows_need_no_rule_scorer_and_model_style_validation_none(tmp_path, random_tiny,
                                                                                                random_tiny_rm):
    from hpcppo.data import synthetic

    rows = synthetic.generate_rows(16, seed=1, split="train", max_operand=19)
    for row in rows:  # verl's full_hh_rlhf rows: a data source no rule scores, style "model"
        row["data_source"], row["reward_model"]["style"] = "Dahoas/full-hh-rlhf", "model"
    synthetic.write_split(tmp_path / "hh.parquet", rows)
    hh = {**random_tiny, "train": tmp_path / "hh.parquet", "val": tmp_path / "hh.parquet"}
    rm = f'[reward_model]\nenable = true\npath = "{random_tiny_rm}"\n'
    assert compile_config(_spec(tmp_path, hh, rm), "local").experiment.reward_model.enable
    assert "Dahoas/full-hh-rlhf" in _error(_spec(tmp_path, hh, ""))  # the rule-based run cannot score them
    # validation files whose rows are rule-scored are still checked with a reward model
    mixed = {**hh, "val": random_tiny["train"]}
    assert compile_config(_spec(tmp_path, mixed, rm), "local")
    rows[0]["reward_model"]["style"] = "rule"
    synthetic.write_split(tmp_path / "hh-rule.parquet", rows)
    assert "Dahoas/full-hh-rlhf" in _error(_spec(tmp_path, {**hh, "val": tmp_path / "hh-rule.parquet"}, rm))
