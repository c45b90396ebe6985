"""A synthetic arithmetic task in verl's Parquet schema, with its rule-based reward.

The task: the user message is an expression such as ``"37+58="`` and the correct completion is the
integer answer (``"95"``) followed by the end-of-sequence token. Difficulty is dialled with
``max_operand`` (operands are drawn uniformly from ``0..max_operand``), ``num_operands`` (2 or more)
and ``operators`` (``"+"`` and/or ``"-"``; with ``"-"`` answers can be negative).

Splits: a problem (its expression string) belongs to the validation pool when a stable hash of the
expression falls below ``val_fraction``; every other problem belongs to the training pool. So the
``train`` and ``val`` splits are *disjoint by construction* for any seed, and a problem never moves
between pools when ``n`` or the seed change. Rows within one split are drawn with replacement, so a
split larger than its pool repeats problems.

Rows follow verl's schema (``data_source``, ``prompt`` as a list of chat messages, ``ability``,
``reward_model{style, ground_truth}``, ``extra_info``), so verl users' tooling reads them as is.

This module must not import torch: the login-node CLI prepares data with it.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from hpcppo.fsutil import atomic_write

DATA_SOURCE = "hpcppo/arith"
ABILITY = "arithmetic"
SPLITS = ("train", "val", "test")
ALLOWED_OPERATORS = ("+", "-")

# verl's nested column types (as its GSM8K preprocessing writes them), plus our extra_info fields.
MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])
REWARD_MODEL_TYPE = pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
EXTRA_INFO_TYPE = pa.struct(
    [
        ("split", pa.string()),
        ("index", pa.int64()),
        ("question", pa.string()),
        ("answer", pa.int64()),
        ("operands", pa.list_(pa.int64())),
        ("operators", pa.list_(pa.string())),
    ]
)
SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(MESSAGE_TYPE)),
        ("ability", pa.string()),
        ("reward_model", REWARD_MODEL_TYPE),
        ("extra_info", EXTRA_INFO_TYPE),
    ]
)

# An answer longer than this is garbage, not a number: it also keeps int() away from Python's
# 4300-digit conversion limit, which would raise on adversarial model output.
_MAX_ANSWER_DIGITS = 32
INT64_MAX = 2**63 - 1
_INT_RE = re.compile(r"-?\d+")


def _check_settings(
    n: int, split: str, max_operand: int, num_operands: int, operators: Sequence[str], val_fraction: float
) -> None:
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if not isinstance(max_operand, int) or max_operand < 1:
        raise ValueError(f"max_operand must be an integer >= 1, got {max_operand!r}")
    if not isinstance(num_operands, int) or num_operands < 2:
        raise ValueError(f"num_operands must be an integer >= 2, got {num_operands!r}")
    if num_operands * max_operand > INT64_MAX:  # the answer column is int64 (SCHEMA)
        raise ValueError(f"max_operand must be at most {INT64_MAX // num_operands:,} with {num_operands} operands (the "
                         f"answer is stored as a 64-bit integer), got {max_operand!r}")
    if not operators or any(op not in ALLOWED_OPERATORS for op in operators):
        raise ValueError(f"operators must be a non-empty subset of {ALLOWED_OPERATORS}, got {tuple(operators)!r}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")


def format_question(operands: Sequence[int], operators: Sequence[str]) -> str:
    """``[37, 58], ["+"]`` -> ``"37+58="`` (the user message)."""
    parts = [str(operands[0])]
    for op, value in zip(operators, operands[1:], strict=True):
        parts.append(f"{op}{value}")
    return "".join(parts) + "="


def evaluate(operands: Sequence[int], operators: Sequence[str]) -> int:
    """Left-to-right value of the expression (only + and -, so no precedence question)."""
    total = operands[0]
    for op, value in zip(operators, operands[1:], strict=True):
        total = total + value if op == "+" else total - value
    return total


def is_validation_problem(question: str, val_fraction: float) -> bool:
    """Whether ``question`` belongs to the validation pool (stable across seeds, runs and machines)."""
    digest = hashlib.blake2b(question.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < val_fraction


def generate_rows(
    n: int,
    *,
    seed: int,
    split: str = "train",
    max_operand: int = 99,
    num_operands: int = 2,
    operators: Sequence[str] = ("+",),
    val_fraction: float = 0.1,
) -> list[dict[str, Any]]:
    """``n`` arithmetic problems as verl rows, deterministic in all arguments.

    ``split`` "train" draws from the training pool; "val" and "test" draw from the validation pool
    (see the module docstring: disjoint from training by construction). Raises ``ValueError`` for a
    bad setting or when the chosen pool is empty (a tiny ``max_operand`` with a small ``val_fraction``).
    """
    _check_settings(n, split, max_operand, num_operands, operators, val_fraction)
    want_val = split != "train"
    # The split name is part of the seed so "val" and "test" rows differ for the same seed.
    rng = random.Random(f"hpcppo-arith:{seed}:{split}")
    rows: list[dict[str, Any]] = []
    attempts = 0
    # Enough attempts to fill a pool holding ~0.1% of problems; beyond that the pool is as good as empty.
    max_attempts = 1000 * max(n, 1) + 10_000
    while len(rows) < n:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(
                f"could not draw {n} {split!r} problems with max_operand={max_operand}, "
                f"num_operands={num_operands}, val_fraction={val_fraction}: that pool is (nearly) empty; "
                "raise max_operand or val_fraction"
            )
        operands = [rng.randint(0, max_operand) for _ in range(num_operands)]
        ops = [rng.choice(list(operators)) for _ in range(num_operands - 1)]
        question = format_question(operands, ops)
        if is_validation_problem(question, val_fraction) != want_val:
            continue
        answer = evaluate(operands, ops)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": question}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                "extra_info": {
                    "split": split,
                    "index": len(rows),
                    "question": question,
                    "answer": answer,
                    "operands": operands,
                    "operators": ops,
                },
            }
        )
    return rows


def write_split(path: str | os.PathLike[str], rows: list[dict[str, Any]], *, metadata: dict[str, str] | None = None) -> Path:
    """Write ``rows`` to Parquet at ``path`` atomically (temp file, fsync, rename); returns the path.

    ``metadata`` (str -> str) is stored in the Parquet schema metadata, e.g. the settings hash that
    lets a builder skip work when the file is already up to date (see ``read_metadata``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = SCHEMA
    if metadata:
        schema = schema.with_metadata({k.encode(): v.encode() for k, v in metadata.items()})
    table = pa.Table.from_pylist(rows, schema=schema)
    return atomic_write(path, lambda fh: pq.write_table(table, fh))


def read_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """The str -> str schema metadata of a Parquet file written by ``write_split`` (empty if none)."""
    meta = pq.read_schema(path).metadata or {}
    return {k.decode(): v.decode() for k, v in meta.items() if not k.startswith(b"ARROW:")}


def extract_answer(solution_str: str) -> int | None:
    """The first (optionally negative) integer in ``solution_str``, or None if there is none.

    Whitespace and any text around the number are ignored ("  95<eos>" and "the answer is 95" both
    give 95). A digit run longer than 32 characters is treated as no answer.
    """
    if not isinstance(solution_str, str):
        return None
    match = _INT_RE.search(solution_str)
    if match is None:
        return None
    text = match.group(0)
    if len(text.lstrip("-")) > _MAX_ANSWER_DIGITS:
        return None
    return int(text)


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    """verl's reward-function signature: 1.0 when the completion's answer equals ``ground_truth``, else 0.0.

    The answer is the first integer of the completion (``extract_answer``), compared numerically, so
    "095" counts as 95. Odd completions (empty, non-text, huge digit runs) score 0.0 and never raise.
    A ``ground_truth`` that is not an integer is a data bug and raises ``ValueError`` naming it.
    """
    del data_source, extra_info  # one task, one rule; kept for verl's signature
    try:
        expected = int(str(ground_truth).strip())
    except ValueError:
        raise ValueError(f"arith ground_truth must be an integer string, got {ground_truth!r}") from None
    answer = extract_answer(solution_str)
    return 1.0 if answer is not None and answer == expected else 0.0


def score_with_pred(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> dict[str, Any]:
    """:func:`compute_score` with the answer read: ``{"score": 0.0 | 1.0, "pred": "<integer>" | None}``, the shape
    of verl's scorers that report a prediction (``math_dapo``'s ``compute_score`` returns ``score``, ``acc`` and
    ``pred``). Validation at ``rollout.val_n`` > 1 votes on ``pred`` for ``maj@k`` (verl's ``calc_maj_val``); this is
    the ``arith`` built-in."""
    answer = extract_answer(solution_str)
    return {"score": compute_score(data_source, solution_str, ground_truth, extra_info),
            "pred": None if answer is None else str(answer)}
