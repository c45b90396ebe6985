"""verl-schema Parquet I/O, PromptDataset tokenisation/truncation, the no-torch rule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from hpcppo.data import dataset as ds
from hpcppo.data.dataset import (
    PromptDataset,
    PromptRecord,
    prompt_schema,
    read_prompts,
    write_prompts_parquet,
)
from hpcppo.errors import ConfigError, PathError

ROOT = Path(__file__).resolve().parents[2]


def row(i: int, content: str = "what is 1 plus 1 ?", **extra) -> dict:
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i)},
        "extra_info": {"split": "train", "index": i, "answer": f"#### {i}", "question": content, **extra},
    }


# ------------------------------------------------------------------------------------------ Parquet I/O

def test_write_read_round_trip_with_the_explicit_schema(tmp_path):
    rows = [row(i) for i in range(5)]
    rows[2]["prompt"].insert(0, {"role": "system", "content": "be brief"})
    path = write_prompts_parquet(rows, tmp_path / "sub" / "train.parquet")
    assert pq.read_schema(path).equals(prompt_schema())
    assert [p.name for p in path.parent.iterdir()] == ["train.parquet"]  # no temp file left behind
    records = read_prompts(path)
    assert [r.to_row() for r in records] == rows
    assert records[2].prompt[0] == {"role": "system", "content": "be brief"}
    assert (records[3].source, records[3].row, records[3].ground_truth) == (str(path), 3, "3")
    assert records[3].extra_info == {"split": "train", "index": 3, "answer": "#### 3",
                                     "question": rows[3]["prompt"][0]["content"]}


def test_read_several_files_and_directories_in_order(tmp_path):
    write_prompts_parquet([row(i) for i in range(3)], tmp_path / "d" / "b.parquet")
    write_prompts_parquet([row(i) for i in range(10, 12)], tmp_path / "d" / "a.parquet")
    write_prompts_parquet([row(99)], tmp_path / "c.parquet")
    records = read_prompts([tmp_path / "c.parquet", tmp_path / "d"])
    assert [r.ground_truth for r in records] == ["99", "10", "11", "0", "1", "2"]
    assert [r.row for r in records] == [0, 0, 1, 0, 1, 2]


def test_reads_files_written_without_our_schema(tmp_path):
    # As other tools write verl files: inferred types, large strings, other struct field orders, extra columns.
    rows = [row(i) for i in range(3)]
    for r in rows:
        r["reward_model"] = {"ground_truth": r["reward_model"]["ground_truth"], "style": "rule"}
        r["images"] = None
    table = pa.Table.from_pylist(rows)
    table = table.set_column(0, "data_source", table.column("data_source").cast(pa.large_string()))
    pq.write_table(table, tmp_path / "x.parquet")
    records = read_prompts(tmp_path / "x.parquet")
    assert [r.ground_truth for r in records] == ["0", "1", "2"]
    assert records[0].reward_style == "rule" and records[0].ability == "math"


def test_prompt_key_and_optional_columns(tmp_path):
    rows = [{"data_source": "my/src", "messages": [{"role": "user", "content": "hi"}],
             "reward_model": {"style": "model", "ground_truth": "x"}}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    (record,) = read_prompts(tmp_path / "m.parquet", prompt_key="messages")
    assert record.prompt == [{"role": "user", "content": "hi"}] and record.ability is None
    assert record.extra_info == {}
    with pytest.raises(ConfigError) as err:
        read_prompts(tmp_path / "m.parquet")
    msg = str(err.value)
    assert str(tmp_path / "m.parquet") in msg and "missing column(s) 'prompt'" in msg
    assert "required: data_source, prompt, reward_model" in msg and "optional: ability, extra_info" in msg
    assert "present: data_source, messages, reward_model" in msg and "data.prompt_key" in msg
    path = write_prompts_parquet([{**rows[0], "extra_info": {"id": "a1", "tags": ["t"]}}], tmp_path / "w.parquet",
                                 prompt_key="messages")
    (again,) = read_prompts(path, prompt_key="messages")
    assert again.extra_info == {"id": "a1", "tags": ["t"]} and again.reward_style == "model"


@pytest.mark.parametrize(
    ("table_rows", "message"),
    [
        ([{"data_source": "s", "prompt": 5, "reward_model": {"ground_truth": "1"}}],
         "column 'prompt' has type int64, expected list<struct<role: string, content: string>> (chat messages) or "
         "string (plain text)"),
        ([{"data_source": "s", "prompt": [{"text": "x"}], "reward_model": {"ground_truth": "1"}}],
         "column 'prompt' has type list<"),
        ([{"data_source": 3, "prompt": [{"role": "u", "content": "x"}], "reward_model": {"ground_truth": "1"}}],
         "column 'data_source' has type int64, expected string"),
        ([{"data_source": "s", "prompt": [{"role": "u", "content": "x"}], "reward_model": "1"}],
         "column 'reward_model' has type string, expected struct"),
        ([{"data_source": "s", "prompt": [{"role": "u", "content": "x"}], "reward_model": {"ground_truth": "1"}},
          {"data_source": "s", "prompt": [], "reward_model": {"ground_truth": "1"}}],
         "row 1: column 'prompt' is null, empty or an empty list"),
        ([{"data_source": "s", "prompt": [{"role": "u", "content": "x"}], "reward_model": {"ground_truth": None}}],
         "row 0: the reward_model column's ground_truth is null"),
        ([{"data_source": "s", "prompt": [{"role": "u", "content": "x"}], "reward_model": {"ground_truth": "1"}},
          {"data_source": None, "prompt": [{"role": "u", "content": "x"}], "reward_model": {"ground_truth": "1"}}],
         "row 1: data_source is null or empty"),
        ([{"data_source": "s", "prompt": [{"role": "u", "content": "x"}, {"role": "u", "content": None}],
           "reward_model": {"ground_truth": "1"}}],
         "row 0: a message in 'prompt' has a null role or content"),
    ],
)
def test_schema_errors_name_the_file_and_problem(tmp_path, table_rows, message):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(table_rows), path)
    with pytest.raises(ConfigError) as err:
        read_prompts(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_path_errors(tmp_path):
    with pytest.raises(PathError, match="nope.parquet: prompt file does not exist"):
        read_prompts(tmp_path / "nope.parquet")
    with pytest.raises(PathError, match="contains no \\*.parquet files"):
        read_prompts(tmp_path)
    (tmp_path / "text.parquet").write_text("not parquet")
    with pytest.raises(PathError, match="text.parquet: not a readable Parquet file"):
        read_prompts(tmp_path / "text.parquet")
    with pytest.raises(ConfigError, match="no prompt files given"):
        read_prompts([])


def test_write_is_atomic_and_validates_rows(tmp_path, monkeypatch):
    path = write_prompts_parquet([row(0)], tmp_path / "t.parquet")
    before = path.read_bytes()
    with pytest.raises(ConfigError, match="row 1: missing key 'reward_model'"):
        write_prompts_parquet([row(1), {"data_source": "s", "prompt": [{"role": "u", "content": "c"}]}], path)
    with pytest.raises(ConfigError, match="row 0: reward_model must be a mapping with a string 'ground_truth'"):
        write_prompts_parquet([{**row(1), "reward_model": {"ground_truth": 5}}], path)

    def crash_midway(table, where, **kw):
        where.write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(ds.pq, "write_table", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        write_prompts_parquet([row(7)], path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


# ------------------------------------------------------------------------------------------ tokenisation

WORDS = "what is 1 plus 1 ? be brief a b c d e f g h <user> <system> <assistant>".split()
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def make_tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", *dict.fromkeys(WORDS)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>")
    fast.chat_template = chat_template
    return fast


def ids(tok, words: str) -> list[int]:
    return [tok.convert_tokens_to_ids(w) for w in words.split()]


def records(*contents: str) -> list[PromptRecord]:
    return [PromptRecord(data_source="s", prompt=[{"role": "user", "content": c}], ground_truth=str(i),
                         source="p.parquet", row=i) for i, c in enumerate(contents)]


def test_chat_template_is_applied_when_the_tokenizer_has_one():
    tok = make_tokenizer(TEMPLATE)
    recs = [PromptRecord(data_source="s", prompt=[{"role": "system", "content": "be brief"},
                                                   {"role": "user", "content": "what is 1 plus 1 ?"}],
                         ground_truth="2")]
    data = PromptDataset(recs, tok, max_prompt_length=32)
    assert data.uses_chat_template
    item = data[0]
    # No BOS: the template's text is tokenised without special tokens, as verl does.
    assert item.input_ids == ids(tok, "<system> be brief <user> what is 1 plus 1 ? <assistant>")
    assert item.index == 0 and item.record is recs[0]
    plain = PromptDataset(recs, tok, max_prompt_length=32, apply_chat_template=False)
    assert plain[0].input_ids == [1] + ids(tok, "be brief what is 1 plus 1 ?")


def test_fallback_without_a_template_joins_contents_with_special_tokens():
    tok = make_tokenizer(None)
    data = PromptDataset(records("a b", "c"), tok, max_prompt_length=8)
    assert not data.uses_chat_template
    assert data.prompt_text(data.records[0]) == "a b"
    assert [data[i].input_ids for i in range(2)] == [[1] + ids(tok, "a b"), [1] + ids(tok, "c")]
    assert data.prompt_lengths == [3, 2] and len(data) == 2
    with pytest.raises(ConfigError, match="apply_chat_template is true but the tokenizer has no chat_template"):
        PromptDataset(records("a"), tok, max_prompt_length=8, apply_chat_template=True)


def test_truncation_modes():
    tok = make_tokenizer(None)
    recs = records("a b c d e f g", "a b")
    with pytest.raises(ConfigError) as err:
        PromptDataset(recs, tok, max_prompt_length=4)
    msg = str(err.value)
    assert "p.parquet: row 0: prompt has 8 tokens, more than max_prompt_length=4" in msg and "truncation" in msg
    left = PromptDataset(recs, tok, max_prompt_length=4, truncation="left")
    right = PromptDataset(recs, tok, max_prompt_length=4, truncation="right")
    assert left[0].input_ids == ids(tok, "d e f g") and right[0].input_ids == [1] + ids(tok, "a b c")
    assert left[1].input_ids == right[1].input_ids == [1] + ids(tok, "a b")
    assert left.truncated == right.truncated == 1
    # verl's middle: the first max//2 tokens and the last max - max//2.
    middle = PromptDataset(recs, tok, max_prompt_length=5, truncation="middle")
    assert middle[0].input_ids == [1] + ids(tok, "a e f g") and middle.truncated == 1
    with pytest.raises(ConfigError, match="truncation: unknown truncation 'center'; allowed: error, left, right, "
                                          "middle"):
        PromptDataset(recs, tok, max_prompt_length=4, truncation="center")
    with pytest.raises(ConfigError, match="max_prompt_length: must be a positive integer"):
        PromptDataset(recs, tok, max_prompt_length=0)


def test_login_node_modules_do_not_import_torch():
    code = ("import sys, hpcppo.data, hpcppo.data.dataset, hpcppo.data.gsm8k, hpcppo.data.rewards, "
            "hpcppo.data.sampler; from hpcppo.data import read_prompts, build_reward_fn; "
            "build_reward_fn('gsm8k'); print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
