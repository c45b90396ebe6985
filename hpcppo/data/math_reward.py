"""The math-verify scorer, by name: ``data.reward_fn = "math_verify"`` (verl's math_verify.compute_score).

verl's ``default_compute_score`` (verl/utils/reward_score/__init__.py, volcengine/verl b178a3c) scores the MATH
sources with its string-normalising ``math_reward.compute_score`` (:mod:`hpcppo.data.math_verl`, what ``"auto"``
uses) and names math-verify as the accurate alternative you switch to yourself (verl/utils/reward_score/
math_verify.py): the ground truth is wrapped in ``\\boxed{}`` and parsed as LaTeX; the completion is parsed as a plain
expression or LaTeX (boxed content first; several boxes in one math segment read as a set); 1.0 when equivalent,
else 0.0 — also 0.0 when either side cannot be parsed. :func:`math_verify_compute_score` is that rule.

math-verify bounds its parsing and comparison with ``signal.alarm`` (math_verify/utils.py ``timeout``), which only
works in the main thread; elsewhere we turn its timeout off instead of letting it raise.

No torch here; math-verify pulls in sympy and latex2sympy2_extended only, and is imported on first use.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

TIMEOUT_S = 5


def _timeout() -> int | None:
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _gold(ground_truth: Any) -> list[Any]:
    from math_verify import LatexExtractionConfig, parse

    return parse("\\boxed{" + str(ground_truth) + "}", [LatexExtractionConfig()], parsing_timeout=_timeout())


def _pred(text: str) -> list[Any]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    return parse(text, [ExprExtractionConfig(), LatexExtractionConfig()], parsing_timeout=_timeout())


def is_equivalent(answer_text: str, ground_truth: Any) -> bool:
    """Whether the answer in ``answer_text`` equals ``ground_truth`` (a MATH answer in LaTeX), by math-verify.

    False when either side does not parse (verl scores those 0 too).
    """
    from math_verify import verify

    try:
        gold = _gold(ground_truth)
        pred = _pred(answer_text)
        return bool(gold and pred and verify(gold, pred, timeout_seconds=_timeout()))
    except Exception:  # math-verify's TimeoutException and sympy's errors: not equivalent, as verl scores them
        return False


def math_verify_compute_score(data_source: str, solution_str: str, ground_truth: Any,
                              extra_info: Mapping[str, Any] | None = None, *, score: float = 1.0,
                              wrong_score: float = 0.0) -> float:
    """verl's math-verify rule: ``score`` when the completion's answer is equivalent to the ground truth, else
    ``wrong_score``."""
    return float(score) if is_equivalent(solution_str, ground_truth) else float(wrong_score)
