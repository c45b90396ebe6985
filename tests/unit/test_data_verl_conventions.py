"""verl's harmless conventions: -1 for checkpoint.save_every / trainer.test_freq, data.truncation = "middle",
data.filter_overlong_prompts, directories of Parquet files, plain-text prompts — schema, help and loader."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from hpcppo.config import explain, load_experiment
from hpcppo.data.dataset import PromptDataset, read_prompts, write_prompts_parquet
from hpcppo.errors import ConfigError
from transformers import PreTrainedTokenizerFast

SPEC = 'name = "v"\n[model]\npath = "m"\n[data]\ntrain_files = ["t.parquet"]\n'


def spec(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(SPEC + extra)
    return path


def test_minus_one_is_accepted_for_save_every_and_test_freq_and_nothing_lower(tmp_path):
    exp = load_experiment(spec(tmp_path), ["checkpoint.save_every=-1", "trainer.test_freq=-1"])
    assert exp.checkpoint.save_every == -1 and exp.trainer.test_freq == -1
    for key in ("checkpoint.save_every", "trainer.test_freq"):
        with pytest.raises(ConfigError) as err:
            load_experiment(spec(tmp_path), [f"{key}=-2"])
        assert key in str(err.value) and ">= -1" in str(err.value)
    text = explain("checkpoint.save_every")
    assert "-1 = never, not even at the end (verl's trainer.save_freq = -1)" in text and "allowed: >= -1" in text
    assert "0 or -1 = never" in explain("trainer.test_freq")


def test_truncation_and_filter_fields(tmp_path):
    exp = load_experiment(spec(tmp_path, 'truncation = "middle"\nfilter_overlong_prompts = true\n'))
    assert exp.data.truncation == "middle" and exp.data.filter_overlong_prompts is True
    assert load_experiment(spec(tmp_path)).data.filter_overlong_prompts is False  # verl's default too
    with pytest.raises(ConfigError) as err:
        load_experiment(spec(tmp_path, 'truncation = "center"\n'))
    assert 'data.truncation' in str(err.value) and '"middle"' in str(err.value)
    assert "verl's data.filter_overlong_prompts" in explain("data.filter_overlong_prompts")
    assert "plain text, which becomes one user message" in explain("data.prompt_key")
    assert "directories of them" in explain("data.train_files")


def test_the_trainer_saves_and_validates_only_for_positive_frequencies():
    from hpcppo.train.trainer import Trainer

    def stand_in(save_every: int, step: int) -> SimpleNamespace:  # what should_save reads of a Trainer
        return SimpleNamespace(cfg=SimpleNamespace(checkpoint=SimpleNamespace(save_every=save_every)), step=step)

    assert [Trainer.should_save(stand_in(3, s)) for s in range(1, 7)] == [False, False, True, False, False, True]
    for never in (0, -1):  # -1 % anything: Python's modulo would make step % -1 == 0 true at every step
        assert not any(Trainer.should_save(stand_in(never, s)) for s in range(1, 7))


def row(i: int, content: str) -> dict:
    return {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": content}],
            "reward_model": {"style": "rule", "ground_truth": str(i)}}


def test_plain_text_prompts_and_directories_load_as_the_job_reads_them(tmp_path):
    folder = tmp_path / "train"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist([{"data_source": "openai/gsm8k", "prompt": "How many eggs?",
                                          "reward_model": {"style": "rule", "ground_truth": "3"}}]),
                   folder / "b.parquet")
    write_prompts_parquet([row(0, "first"), row(1, "second")], folder / "a.parquet")
    (folder / "notes.txt").write_text("ignored")
    records = read_prompts(folder)
    assert [r.prompt for r in records] == [[{"role": "user", "content": "first"}],
                                           [{"role": "user", "content": "second"}],
                                           [{"role": "user", "content": "How many eggs?"}]]
    assert [Path(r.source).name for r in records] == ["a.parquet", "a.parquet", "b.parquet"]
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "s", "prompt": "", "reward_model": {"ground_truth": "1"}}]),
                   empty)
    with pytest.raises(ConfigError, match="row 0: column 'prompt' is null, empty or an empty list"):
        read_prompts(empty)
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text('{"question": "q"}\n')
    with pytest.raises(ConfigError) as err:
        read_prompts(jsonl)
    assert str(err.value).startswith(f"{jsonl}: .jsonl files are not read: prompt files must be Parquet")


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["<unk>", *"a b c d e f g h".split()])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def test_filter_overlong_prompts_drops_before_truncation():
    from hpcppo.data.dataset import PromptRecord

    recs = [PromptRecord(data_source="s", prompt=[{"role": "user", "content": c}], ground_truth=str(i), row=i)
            for i, c in enumerate(["a b", "a b c d e", "c", "a b c d"])]
    data = PromptDataset(recs, word_tokenizer(), max_prompt_length=4, truncation="middle", filter_overlong_prompts=True)
    assert data.filtered == 1 and data.truncated == 0 and len(data) == 3
    assert [data[i].record.row for i in range(3)] == [0, 2, 3]
    with pytest.raises(ConfigError, match="every one of the 2 prompts is longer than max_prompt_length=1"):
        PromptDataset(recs[:2], word_tokenizer(), max_prompt_length=1, filter_overlong_prompts=True)
