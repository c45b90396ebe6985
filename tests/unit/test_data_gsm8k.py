"""GSM8K JSONL -> verl Parquet, on the real files in ../shared/data/gsm8k, and the tools/prepare_gsm8k.py CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hpcppo.data.dataset import GSM8K_EXTRA_INFO_TYPE, prompt_schema, read_prompts
from hpcppo.data.gsm8k import convert_gsm8k, extract_ground_truth
from hpcppo.errors import ConfigError, PathError

ROOT = Path(__file__).resolve().parents[2]
GSM8K_DIR = ROOT.parent / "shared" / "data" / "gsm8k"
needs_gsm8k = pytest.mark.skipif(not (GSM8K_DIR / "test.jsonl").is_file(),
                                 reason=f"real GSM8K data not found at {GSM8K_DIR}")
SUFFIX = ' Let\'s think step by step and output the final answer after "####".'


def raw_lines(name: str) -> list[dict[str, str]]:
    with (GSM8K_DIR / name).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "prepare_gsm8k.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


@needs_gsm8k
def test_convert_the_real_test_split_exactly_as_verl(tmp_path):
    written = convert_gsm8k(GSM8K_DIR / "test.jsonl", tmp_path)
    path, count = written["test"]
    assert count == 1319 and path == tmp_path / "test.parquet"
    assert pq.read_schema(path).equals(prompt_schema(extra_info_type=GSM8K_EXTRA_INFO_TYPE))
    raw = raw_lines("test.jsonl")
    rows = pq.read_table(path).to_pylist()
    assert len(rows) == len(raw) == 1319
    # The first problems, checked by hand against the raw file.
    assert [r["reward_model"]["ground_truth"] for r in rows[:5]] == ["18", "3", "70000", "540", "20"]
    assert raw[2]["answer"].endswith("#### 70000")
    for i, (r, src) in enumerate(zip(rows, raw, strict=True)):
        assert r["data_source"] == "openai/gsm8k" and r["ability"] == "math"
        assert r["prompt"] == [{"role": "user", "content": src["question"] + SUFFIX}]
        gold = src["answer"].rsplit("####", 1)[1].strip().replace(",", "")
        assert r["reward_model"] == {"style": "rule", "ground_truth": gold}
        assert r["extra_info"] == {"split": "test", "index": i, "answer": src["answer"], "question": src["question"]}
    # Thousands separators in the gold answer are removed, as verl does.
    with_commas = [i for i, src in enumerate(raw) if "," in src["answer"].rsplit("####", 1)[1]]
    assert len(with_commas) == 14
    assert all("," not in rows[i]["reward_model"]["ground_truth"] for i in with_commas)
    # And our reader takes the file back.
    records = read_prompts(path)
    assert records[0].ground_truth == "18" and records[1318].row == 1318


@needs_gsm8k
def test_cli_converts_a_directory(tmp_path):
    out = run_tool("--input", str(GSM8K_DIR), "--out", str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr
    assert f"train: 7473 rows -> {tmp_path / 'out' / 'train.parquet'}" in out.stdout
    assert "test: 1319 rows" in out.stdout
    assert pq.read_metadata(tmp_path / "out" / "train.parquet").num_rows == 7473
    only = run_tool("--input", str(GSM8K_DIR), "--out", str(tmp_path / "only"), "--split", "test")
    assert only.returncode == 0, only.stderr
    assert sorted(p.name for p in (tmp_path / "only").iterdir()) == ["test.parquet"]


def test_cli_errors_have_messages_and_exit_codes(tmp_path):
    missing = run_tool("--input", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"))
    assert missing.returncode == PathError.exit_code
    assert "error: " in missing.stderr and "nowhere: no such file or directory" in missing.stderr

    bad = tmp_path / "train.jsonl"
    bad.write_text('{"question": "q", "answer": "a\\n#### 1"}\n{"question": "q2", "answer": \n')
    out = run_tool("--input", str(bad), "--out", str(tmp_path / "o"))
    assert out.returncode == ConfigError.exit_code
    assert f"{bad}: line 2: not valid JSON" in out.stderr

    weird = tmp_path / "mine.jsonl"
    weird.write_text('{"question": "q", "answer": "a\\n#### 1"}\n')
    out = run_tool("--input", str(weird), "--out", str(tmp_path / "o"))
    assert out.returncode == ConfigError.exit_code and "pass --split (train or test)" in out.stderr
    ok = run_tool("--input", str(weird), "--out", str(tmp_path / "o"), "--split", "train")
    assert ok.returncode == 0 and "train: 1 rows" in ok.stdout


def test_library_errors(tmp_path):
    (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": "no final line"}\n')
    with pytest.raises(ConfigError, match="line 1: answer has no '#### <number>' final line"):
        convert_gsm8k(tmp_path, tmp_path / "o")
    with pytest.raises(PathError, match="no GSM8K file found \\(expected train.jsonl\\)"):
        convert_gsm8k(tmp_path, tmp_path / "o", split="train")
    (tmp_path / "test.jsonl").write_text('{"question": "q"}\n')
    with pytest.raises(ConfigError, match="line 1: missing string field 'answer'"):
        convert_gsm8k(tmp_path, tmp_path / "o")
    (tmp_path / "test.jsonl").write_text('["q", "a"]\n')
    with pytest.raises(ConfigError, match="line 1: expected a JSON object, got list"):
        convert_gsm8k(tmp_path, tmp_path / "o")
    with pytest.raises(ConfigError, match="unknown split 'dev'; allowed: train, test"):
        convert_gsm8k(tmp_path, tmp_path / "o", split="dev")
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_extract_ground_truth_like_verl():
    assert extract_ground_truth("x\n#### 1,450,000") == "1450000"
    assert extract_ground_truth("#### -3") == "-3"
    assert extract_ground_truth("#### 0.5") == "0.5"
    assert extract_ground_truth("no answer") is None
