"""Compile checks the data and the reward (hpcppo.data.check) before anything is queued: through compile_config
and the CLI on real Parquet files, with token counts compared against the trainer's own tokenisation
(PromptDataset over transformers) on real GSM8K prompts and a byte-level BPE tokenizer trained here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from hpcppo.cli import main
from hpcppo.compiler import compile_config
from hpcppo.config.experiment import DataSection
from hpcppo.data import check as check_mod
from hpcppo.data.check import check_data
from hpcppo.data.dataset import PromptDataset, read_prompts, write_prompts_parquet
from hpcppo.data.gsm8k import convert_gsm8k
from hpcppo.errors import ConfigError, PathError

ROOT = Path(__file__).resolve().parents[2]
GSM8K_DIR = ROOT.parent / "shared" / "data" / "gsm8k"
needs_gsm8k = pytest.mark.skipif(not (GSM8K_DIR / "test.jsonl").is_file(),
                                 reason=f"real GSM8K data not found at {GSM8K_DIR}")
# A ChatML-style template of our own, with a default system message when there is none (as many models do).
CHATML = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
          "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May? Let's think step by step.",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
    "Output the final answer after \"####\". The total is 1,000 dollars and 25 cents.",
] * 50


def write_bpe_tokenizer(directory: Path, chat_template: str | None = CHATML) -> Path:
    """A real byte-level BPE (trained on a few sentences) saved as a Hugging Face tokenizer directory."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=special,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = chat_template
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(directory)
    return directory


def gsm8k_row(i: int, content: str, source: str = "openai/gsm8k") -> dict:
    return {"data_source": source, "prompt": [{"role": "user", "content": content}],
            "reward_model": {"style": "rule", "ground_truth": str(i)}}


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Path:
    return write_bpe_tokenizer(tmp_path_factory.mktemp("bpe") / "model")


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory) -> dict[str, Path]:
    if not (GSM8K_DIR / "test.jsonl").is_file():
        pytest.skip(f"real GSM8K data not found at {GSM8K_DIR}")
    out = tmp_path_factory.mktemp("gsm8k")
    return {split: path for split, (path, _) in convert_gsm8k(GSM8K_DIR, out).items()}


def trainer_lengths(model_dir: Path, files: list[Path], **kw) -> list[int]:
    """Token counts as the job computes them: read_prompts + PromptDataset over the transformers tokenizer."""
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    return PromptDataset(read_prompts(files), tok, max_prompt_length=10**6, **kw).prompt_lengths


def data(files: list[Path], **kw) -> DataSection:
    return DataSection(train_files=[str(f) for f in files], **kw)


# ------------------------------------------------------------------------------------ prompt lengths

@needs_gsm8k
def test_token_counts_match_the_trainers_on_real_gsm8k(bpe, gsm8k):
    lengths = trainer_lengths(bpe, [gsm8k["test"]])
    assert len(lengths) == 1319 and min(lengths) > 20
    for limit in (min(lengths) - 1, sorted(lengths)[600], sorted(lengths)[1300], max(lengths)):
        report = check_data(data([gsm8k["test"]], max_prompt_length=limit, truncation="left"), train_batch_size=1,
                            tokenizer_dir=str(bpe))
        (check,) = report.files["data.train_files"]
        over = [(row, n) for row, n in enumerate(lengths) if n > limit]
        assert check.too_long == len(over), limit
        if over:
            assert check.longest[1] == max(n for _, n in over) and lengths[check.longest[0]] == check.longest[1]
        else:
            assert check.longest is None
        # Only rows whose bytes could exceed the limit were tokenised; with the longest as limit, almost none.
        assert check.tokenized >= check.too_long
    assert report.lengths_checked and check.tokenized < 1319


@needs_gsm8k
def test_overlong_prompts_fail_compile_with_the_count_the_longest_and_the_fixes(tmp_path, bpe, gsm8k):
    lengths = trainer_lengths(bpe, [gsm8k["train"]])
    limit = sorted(lengths)[-10]
    over = sum(n > limit for n in lengths)
    with pytest.raises(ConfigError) as err:
        check_data(data([gsm8k["train"]], max_prompt_length=limit), train_batch_size=8, tokenizer_dir=str(bpe))
    longest = max(lengths)
    assert str(err.value) == (
        f"{gsm8k['train']}: data.max_prompt_length: {over} of 7473 prompts are longer than max_prompt_length={limit} "
        f"tokens (the longest: row {lengths.index(longest)}, {longest} tokens) (set data.max_prompt_length >= "
        f"{longest}, set data.filter_overlong_prompts = true (drops them) or data.truncation = \"left\", \"right\" or "
        f"\"middle\" (cuts them))")
    # filter_overlong_prompts: a warning with the count; the job then drops exactly those rows.
    report = check_data(data([gsm8k["train"]], max_prompt_length=limit, filter_overlong_prompts=True),
                        train_batch_size=8, tokenizer_dir=str(bpe))
    assert report.notes == [f"{gsm8k['train']}: {over} of 7473 prompts are longer than max_prompt_length={limit} "
                            f"tokens (the longest: row {lengths.index(longest)}, {longest} tokens); "
                            f"filter_overlong_prompts drops them"]
    tok = PreTrainedTokenizerFast.from_pretrained(bpe)
    kept = PromptDataset(read_prompts(gsm8k["train"]), tok, max_prompt_length=limit, filter_overlong_prompts=True)
    assert kept.filtered == over and len(kept) == 7473 - over
    # ... and if that leaves less than a batch, compile says so.
    with pytest.raises(ConfigError, match=r"trainer.train_batch_size: the training files have \d+ prompts (\(estimated "
                                          r"from a sample\) )?after filter_overlong_prompts drops the over-long ones, "
                                          r"fewer than one batch"):
        check_data(data([gsm8k["train"]], max_prompt_length=min(lengths) + 1, filter_overlong_prompts=True),
                   train_batch_size=4096, tokenizer_dir=str(bpe))
    # A truncation mode: a warning, no error.
    report = check_data(data([gsm8k["train"]], max_prompt_length=limit, truncation="middle"), train_batch_size=8,
                        tokenizer_dir=str(bpe))
    assert report.notes[0].endswith("truncation = 'middle' cuts them")


def test_plain_text_and_multi_message_prompts_count_like_the_trainer(tmp_path, bpe):
    long = " ".join(CORPUS[:6])
    text_file = tmp_path / "text.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "openai/gsm8k", "prompt": t,
                                          "reward_model": {"ground_truth": "1"}} for t in (long, "Weng earns $12.")]),
                   text_file)
    chat_file = write_prompts_parquet(
        [{**gsm8k_row(0, long), "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": long}]},
         gsm8k_row(1, "How many clips?")], tmp_path / "chat.parquet")
    for path in (text_file, chat_file):
        lengths = trainer_lengths(bpe, [path])
        report = check_data(data([path], max_prompt_length=lengths[1], truncation="left"), train_batch_size=1,
                            tokenizer_dir=str(bpe))
        (check,) = report.files["data.train_files"]
        assert (check.too_long, check.longest) == (1, (0, lengths[0])), path
    # Without a chat template the contents are joined and the tokenizer's special tokens added, as in the job.
    plain = write_bpe_tokenizer(tmp_path / "plain", chat_template=None)
    lengths = trainer_lengths(plain, [chat_file])
    report = check_data(data([chat_file], max_prompt_length=lengths[1], truncation="left"), train_batch_size=1,
                        tokenizer_dir=str(plain))
    assert report.files["data.train_files"][0].longest == (0, lengths[0])


def test_lengths_are_skipped_with_a_note_without_a_local_tokenizer(tmp_path):
    path = write_prompts_parquet([gsm8k_row(i, "q" * 5000) for i in range(4)], tmp_path / "t.parquet")
    report = check_data(data([path], max_prompt_length=8), train_batch_size=4, tokenizer_dir=str(tmp_path / "none"))
    assert not report.lengths_checked and report.files["data.train_files"][0].too_long == 0
    assert report.notes == [f"prompt lengths not checked: no tokenizer.json in {tmp_path / 'none'} (the job checks "
                            "them when it loads the tokenizer)"]


# ------------------------------------------------------------------------------------ schema, sources, reward

def test_schema_problems_name_the_file_and_the_columns_present(tmp_path):
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "openai/gsm8k", "question": "q", "answer": "1"}]), bad)
    with pytest.raises(ConfigError) as err:
        check_data(data([bad]), train_batch_size=1, tokenizer_dir=None)
    assert str(err.value) == (f"{bad}: missing column(s) 'prompt', 'reward_model'; required: data_source, prompt, "
                              "reward_model; optional: ability, extra_info; present: data_source, question, answer "
                              "(is the prompt column named differently? set data.prompt_key)")
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text('{"question": "q", "answer": "#### 1"}\n')
    with pytest.raises(ConfigError, match=r"train.jsonl: .jsonl files are not read: prompt files must be Parquet"):
        check_data(data([jsonl]), train_batch_size=1, tokenizer_dir=None)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 not really")
    with pytest.raises(PathError, match="garbage.parquet: not a readable Parquet file"):
        check_data(data([garbage]), train_batch_size=1, tokenizer_dir=None)


def test_every_data_source_needs_a_scorer_unless_reward_fn_is_set(tmp_path):
    rows = [gsm8k_row(0, "a"), gsm8k_row(1, "b", "lighteval/MATH"), gsm8k_row(2, "c", "my/set"),
            gsm8k_row(3, "d", "my/set")]
    path = write_prompts_parquet(rows, tmp_path / "mixed.parquet")
    with pytest.raises(ConfigError) as err:
        check_data(data([path]), train_batch_size=1, tokenizer_dir=None)
    msg = str(err.value)
    assert msg.startswith(f"{path}: data.reward_fn: no built-in reward for data_source 'my/set' "
                          "(data.reward_fn = \"auto\"); known data sources: openai/gsm8k, hpcppo/arith, hpcppo/arith-tool, lighteval/MATH")
    assert err.value.__notes__ == ["2 of the file's rows have this data_source"]
    (tmp_path / "my_scorer.py").write_text(
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
        "def wrong(solution, truth):\n    return 1.0\n")
    report = check_data(data([path], reward_fn=f"{tmp_path / 'my_scorer.py'}:score"), train_batch_size=4,
                        tokenizer_dir=None)
    assert report.files["data.train_files"][0].data_sources == {"openai/gsm8k": 1, "lighteval/MATH": 1, "my/set": 2}
    with pytest.raises(ConfigError, match=r"data.reward_fn: reward function .*my_scorer.py:wrong' has signature "
                                          r"\(solution, truth\), which cannot be called"):
        check_data(data([path], reward_fn=f"{tmp_path / 'my_scorer.py'}:wrong"), train_batch_size=1,
                   tokenizer_dir=None)
    with pytest.raises(ConfigError, match=r"has no attribute 'scor'; its functions: score, wrong \(did you mean "
                                          r"'score'\?\)"):
        check_data(data([path], reward_fn=f"{tmp_path / 'my_scorer.py'}:scor"), train_batch_size=1,
                   tokenizer_dir=None)
    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.Table.from_pylist([gsm8k_row(0, "a"), {**gsm8k_row(1, "b"), "data_source": None}]), nulls)
    with pytest.raises(ConfigError, match=r"nulls.parquet: row 1: data_source is null or empty \(1 rows\)"):
        check_data(data([nulls]), train_batch_size=1, tokenizer_dir=None)


def test_rows_against_the_batch_and_directories_of_files(tmp_path):
    folder = tmp_path / "train"
    folder.mkdir()
    write_prompts_parquet([gsm8k_row(i, "q") for i in range(3)], folder / "part-0.parquet")
    write_prompts_parquet([gsm8k_row(i, "q") for i in range(2)], folder / "part-1.parquet")
    (folder / "README.txt").write_text("not data")
    report = check_data(data([folder]), train_batch_size=5, tokenizer_dir=None)
    assert [Path(f.path).name for f in report.files["data.train_files"]] == ["part-0.parquet", "part-1.parquet"]
    assert report.rows("data.train_files") == 5
    with pytest.raises(ConfigError) as err:
        check_data(data([folder]), train_batch_size=6, tokenizer_dir=None)
    assert str(err.value) == ("trainer.train_batch_size: the training files have 5 prompts, fewer than one batch of "
                              "6 (set trainer.train_batch_size <= 5 or add prompts)")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PathError, match=r"data.val_files\[0\]: directory .*empty contains no \*.parquet files"):
        check_data(data([folder], val_files=[str(tmp_path / "empty")]), train_batch_size=5, tokenizer_dir=None)


# ------------------------------------------------------------------------------------ through compile and the CLI

SPEC = """name = "chk"
[model]
path = "model"
[data]
train_files = ["data"]
max_prompt_length = {limit}
[trainer]
train_batch_size = 8
[actor]
ppo_mini_batch_size = 8
ppo_micro_batch_size_per_gpu = 1
"""


def test_compile_runs_the_checks_and_no_check_paths_skips_them(tmp_path, bpe, capsys):
    (tmp_path / "data").mkdir()
    write_bpe_tokenizer(tmp_path / "model")
    (tmp_path / "model" / "config.json").write_text('{"max_position_embeddings": 4096}')  # compile wants a model here
    write_prompts_parquet([gsm8k_row(i, " ".join(CORPUS[:i + 1])) for i in range(10)],
                          tmp_path / "data" / "a.parquet")
    lengths = trainer_lengths(tmp_path / "model", [tmp_path / "data" / "a.parquet"])
    spec = tmp_path / "exp.toml"
    spec.write_text(SPEC.format(limit=max(lengths)))
    assert compile_config(spec, "local").experiment.data.train_files == [str(tmp_path / "data")]
    spec.write_text(SPEC.format(limit=lengths[7]))
    runs = tmp_path / "runs"
    assert main(["compile", str(spec), "--runs-root", str(runs), "-q"]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and not runs.exists()
    assert err.startswith(f"hpcppo: error: {tmp_path / 'data' / 'a.parquet'}: data.max_prompt_length: 2 of 10 prompts "
                          f"are longer than max_prompt_length={lengths[7]} tokens (the longest: row 9, {lengths[9]} "
                          "tokens)")
    assert main(["compile", str(spec), "--runs-root", str(runs), "-q", "--no-check-paths"]) == 0
    capsys.readouterr()
    # The warning of a filter reaches the user's terminal.
    proc = subprocess.run([sys.executable, "-m", "hpcppo.cli", "compile", str(spec), "--runs-root", str(runs), "-q",
                           "-o", "data.filter_overlong_prompts=true"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "2 of 10 prompts are longer than" in proc.stderr and "filter_overlong_prompts drops them" in proc.stderr


def test_compile_with_the_data_check_imports_neither_torch_nor_transformers(tmp_path):
    (tmp_path / "data").mkdir()
    write_bpe_tokenizer(tmp_path / "model")
    (tmp_path / "model" / "config.json").write_text('{"max_position_embeddings": 4096}')
    write_prompts_parquet([gsm8k_row(i, CORPUS[i]) for i in range(8)], tmp_path / "data" / "a.parquet")
    spec = tmp_path / "exp.toml"
    spec.write_text(SPEC.format(limit=512))
    code = ("import json, sys; from hpcppo.cli import main; "
            f"rc = main(['compile', {str(spec)!r}, '--runs-root', {str(tmp_path / 'runs')!r}, '-q']); "
            "import hpcppo.data.check as c; "
            "print(json.dumps([rc, sorted(m for m in ('torch', 'transformers') if m in sys.modules), "
            "'hpcppo.data.check' in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [0, [], True]


@needs_gsm8k
def test_a_large_file_is_sampled_and_the_count_is_labelled_an_estimate(bpe, gsm8k, monkeypatch):
    lengths = trainer_lengths(bpe, [gsm8k["train"]])
    limit = sorted(lengths)[len(lengths) // 2]
    exact = sum(n > limit for n in lengths)
    monkeypatch.setattr(check_mod, "SAMPLE_ROWS", 1000)
    monkeypatch.setattr(check_mod, "BATCH_ROWS", 1500)  # several batches: row numbers must stay global
    with pytest.raises(ConfigError) as err:
        check_data(data([gsm8k["train"]], max_prompt_length=limit), train_batch_size=8, tokenizer_dir=str(bpe))
    report = check_data(data([gsm8k["train"]], max_prompt_length=limit, truncation="right"), train_batch_size=8,
                        tokenizer_dir=str(bpe))
    (check,) = report.files["data.train_files"]
    assert check.estimated and check.tokenized == 1000 and check.candidates > 1000
    # 1,000 of ~7,000 rows: a binomial estimate of a ~50% share, well within 10% of the truth.
    assert abs(check.too_long - exact) < 0.1 * exact
    row, tokens = check.longest
    assert lengths[row] == tokens > limit
    assert str(err.value).startswith(f"{gsm8k['train']}: data.max_prompt_length: about {check.too_long} of 7473 "
                                     f"prompts are longer than max_prompt_length={limit} tokens (counted on a sample "
                                     f"of 1000 of the {check.candidates} rows long enough in bytes to be; the longest "
                                     f"found: row {row}, {tokens} tokens)")
    # Nothing over the limit in the sample: said, not claimed as a fact about every row.
    monkeypatch.setattr(check_mod, "SAMPLE_ROWS", 10)
    report = check_data(data([gsm8k["train"]], max_prompt_length=max(lengths)), train_batch_size=8,
                        tokenizer_dir=str(bpe))
    (check,) = report.files["data.train_files"]
    assert check.estimated and check.too_long == 0 and check.tokenized == 10
    assert report.notes == [f"{gsm8k['train']}: none of a sample of 10 of the {check.candidates} rows long enough in "
                            f"bytes is over max_prompt_length={max(lengths)} tokens; the job checks every row"]
