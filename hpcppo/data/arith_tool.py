"""The tool-use arithmetic task: 3-digit multiplication a tiny model cannot do in its head, and its reward.

The user message is ``"123*456="``; the reward is 1 when the *final answer* is the product, 0 otherwise. The final
answer is the text of the last assistant turn: in a multi-turn response (``<call>calculator(123*456)</call>``, the
tool turn ``<|tool|>56088``, then ``<|assistant|>56088``) that is the text after the last :data:`ASSISTANT_MARKER`;
a response without one (a single turn) is its own final turn. The final turn must be the number and nothing else,
so a turn that only calls the tool (whose call holds the operands, whose tool turn holds the product) scores 0: the
reward goes to an answer given, not to an answer seen. The tiny tool model's tokenizer keeps its role markers out
of the special tokens for that reason (they survive ``skip_special_tokens``, as Qwen's role names do after
``<|im_start|>``), see :mod:`hpcppo.tiny.tokenizer`.

Rows follow verl's schema as :mod:`hpcppo.data.synthetic`'s do (its Parquet schema, writer and split rule): a
problem belongs to the validation pool when a stable hash of its question falls below ``val_fraction``. No torch.
"""

from __future__ import annotations

import random
import re
from typing import Any

from hpcppo.data import synthetic

__all__ = ["DATA_SOURCE", "ASSISTANT_MARKER", "generate_rows", "final_turn", "compute_score", "score_with_pred"]

DATA_SOURCE = "hpcppo/arith-tool"
ABILITY = "arithmetic-tool-use"
#: The assistant role marker of the tiny tool model's chat template (hpcppo.tiny.tokenizer; a test keeps them equal).
ASSISTANT_MARKER = "<|assistant|>"
_ANSWER = re.compile(r"\s*(-?\d{1,32})\s*")


def _check(n: int, split: str, min_operand: int, max_operand: int, val_fraction: float) -> None:
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if split not in synthetic.SPLITS:
        raise ValueError(f"split must be one of {', '.join(synthetic.SPLITS)}, got {split!r}")
    if not (isinstance(min_operand, int) and isinstance(max_operand, int) and 0 <= min_operand < max_operand):
        raise ValueError(f"operands must satisfy 0 <= min_operand < max_operand, got {min_operand!r} and "
                         f"{max_operand!r}")
    if max_operand > 10**9:  # the product is stored as a 64-bit integer
        raise ValueError(f"max_operand must be at most 1,000,000,000, got {max_operand!r}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")


def generate_rows(n: int, *, seed: int, split: str = "train", min_operand: int = 100, max_operand: int = 999,
                  val_fraction: float = 0.1) -> list[dict[str, Any]]:
    """``n`` problems ``a*b=`` with ``a, b`` drawn from ``min_operand..max_operand``, deterministic in all arguments;
    ``train`` draws from the training pool, ``val`` and ``test`` from the validation pool (disjoint)."""
    _check(n, split, min_operand, max_operand, val_fraction)
    rng = random.Random(f"hpcppo-arith-tool:{seed}:{split}")
    want_val = split != "train"
    rows: list[dict[str, Any]] = []
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 1000 * n + 10_000:
            raise ValueError(f"could not draw {n} {split!r} problems from {min_operand}..{max_operand}: that pool is "
                             "(nearly) empty")
        a, b = rng.randint(min_operand, max_operand), rng.randint(min_operand, max_operand)
        question = f"{a}*{b}="
        if synthetic.is_validation_problem(question, val_fraction) != want_val:
            continue
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": question}],
            "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": str(a * b)},
            "extra_info": {"split": split, "index": len(rows), "question": question, "answer": a * b,
                           "operands": [a, b], "operators": ["*"]},
        })
    return rows


def final_turn(solution_str: str) -> str:
    """The text of the response's last assistant turn: after the last :data:`ASSISTANT_MARKER`, or all of it."""
    return solution_str.rpartition(ASSISTANT_MARKER)[2]


def _answer(solution_str: str) -> int | None:
    m = _ANSWER.fullmatch(final_turn(solution_str)) if isinstance(solution_str, str) else None
    return int(m.group(1)) if m else None


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict[str, Any] | None = None) -> float:
    """verl's reward signature: 1.0 when the final turn is exactly the integer ``ground_truth``, else 0.0."""
    del data_source, extra_info
    try:
        expected = int(str(ground_truth).strip())
    except ValueError:
        raise ValueError(f"arith-tool ground_truth must be an integer string, got {ground_truth!r}") from None
    return 1.0 if _answer(solution_str) == expected else 0.0


def score_with_pred(data_source: str, solution_str: str, ground_truth: str,
                    extra_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """:func:`compute_score` with the answer read (``pred``), the shape validation's maj@k votes on."""
    answer = _answer(solution_str)
    return {"score": compute_score(data_source, solution_str, ground_truth, extra_info),
            "pred": None if answer is None else str(answer)}
