"""GSM8K JSONL -> verl's Parquet, byte-for-byte the rows verl's ``examples/data_preprocess/gsm8k.py`` produces.

Input: the layout of github.com/openai/grade-school-math (``train.jsonl``/``test.jsonl``, one JSON object a line
with ``question`` and ``answer``; the answer ends with ``#### <number>``). Output per split ``<split>.parquet``::

    data_source  = "openai/gsm8k"
    prompt       = [{"role": "user", "content": question + " " + INSTRUCTION}]
    ability      = "math"
    reward_model = {"style": "rule", "ground_truth": "<the number after ####, commas removed>"}
    extra_info   = {"split": split, "index": line index in the file, "answer": raw answer, "question": raw question}

No torch here: this runs on the login node (``tools/prepare_gsm8k.py``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hpcppo.data.dataset import GSM8K_EXTRA_INFO_TYPE, write_prompts_parquet
from hpcppo.errors import ConfigError, PathError

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")
# verl's extractor: the first "#### <digits, dots, commas>" in the answer; the gold answers have exactly one.
_GOLD_RE = re.compile(r"#### (-?[0-9.,]+)")


def extract_ground_truth(answer: str) -> str | None:
    """The gold number of a GSM8K ``answer`` with commas removed, as verl stores it; None if there is no ``####``."""
    match = _GOLD_RE.search(answer)
    return None if match is None else match.group(1).replace(",", "")


def read_gsm8k_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a GSM8K JSONL file; errors name the file and line (1-based)."""
    path = Path(path)
    if not path.is_file():
        raise PathError(f"{path}: GSM8K file does not exist")
    examples: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"line {lineno}: not valid JSON ({exc.msg})", file=str(path)) from exc
            if not isinstance(obj, dict):
                raise ConfigError(f"line {lineno}: expected a JSON object, got {type(obj).__name__}", file=str(path))
            for key in ("question", "answer"):
                if not isinstance(obj.get(key), str):
                    raise ConfigError(f"line {lineno}: missing string field {key!r} (a GSM8K line has "
                                      f"'question' and 'answer')", file=str(path))
            examples.append({"question": obj["question"], "answer": obj["answer"], "_line": lineno})
    return examples


def gsm8k_rows(examples: Iterable[Mapping[str, Any]], split: str, *, file: str = "<memory>") -> list[dict[str, Any]]:
    """verl-schema rows for GSM8K examples; ``index`` is the position in ``examples`` (as verl's ``with_indices``)."""
    rows = []
    for index, ex in enumerate(examples):
        ground_truth = extract_ground_truth(ex["answer"])
        if ground_truth is None:
            line = ex.get("_line", index + 1)
            raise ConfigError(f"line {line}: answer has no '#### <number>' final line: {ex['answer'][-80:]!r}",
                              file=file)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": ex["question"] + " " + INSTRUCTION}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": ground_truth},
                "extra_info": {"split": split, "index": index, "answer": ex["answer"], "question": ex["question"]},
            }
        )
    return rows


def convert_gsm8k_file(path: str | os.PathLike[str], out_dir: str | os.PathLike[str], split: str) -> tuple[Path, int]:
    """Convert one JSONL file to ``out_dir/<split>.parquet``; returns the path and the row count."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}", key="split")
    examples = read_gsm8k_jsonl(path)
    if not examples:
        raise ConfigError("file has no examples", file=str(path))
    rows = gsm8k_rows(examples, split, file=str(path))
    out = write_prompts_parquet(rows, Path(out_dir) / f"{split}.parquet", extra_info_type=GSM8K_EXTRA_INFO_TYPE)
    return out, len(rows)


def convert_gsm8k(
    input_path: str | os.PathLike[str], out_dir: str | os.PathLike[str], *, split: str | None = None
) -> dict[str, tuple[Path, int]]:
    """Convert a GSM8K directory (``train.jsonl``/``test.jsonl``) or a single file.

    For a directory, ``split`` selects one split (default: every split whose file exists). For a file, ``split``
    defaults to the file's stem when that is ``train`` or ``test``. Returns ``{split: (parquet path, rows)}``.
    """
    input_path = Path(input_path)
    if split is not None and split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}", key="split")
    if input_path.is_dir():
        wanted = [split] if split else list(SPLITS)
        sources = {s: input_path / f"{s}.jsonl" for s in wanted if (input_path / f"{s}.jsonl").is_file()}
        if not sources:
            expected = ", ".join(f"{s}.jsonl" for s in wanted)
            raise PathError(f"{input_path}: no GSM8K file found (expected {expected})")
    elif input_path.is_file():
        chosen = split or (input_path.stem if input_path.stem in SPLITS else None)
        if chosen is None:
            raise ConfigError(f"cannot tell the split of {input_path.name!r}; pass --split "
                              f"({' or '.join(SPLITS)})", key="split")
        sources = {chosen: input_path}
    else:
        raise PathError(f"{input_path}: no such file or directory")
    return {s: convert_gsm8k_file(p, out_dir, s) for s, p in sources.items()}
