"""MATH-style scorers for verl's ``data_source`` names, with math-verify deciding equivalence.

verl's ``default_compute_score`` (verl/utils/reward_score/__init__.py, volcengine/verl b178a3c) routes:

- ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500`` to its MATH scorer, and
  documents math-verify as the accurate alternative (verl/utils/reward_score/math_verify.py): the ground truth is
  wrapped in ``\\boxed{}`` and parsed as LaTeX; the completion is parsed as a plain expression or LaTeX (boxed
  content first; several boxes in one math segment read as a set); 1.0 when equivalent, else 0.0 — also 0.0 when
  either side cannot be parsed.
  :func:`math_compute_score` is that rule.
- ``math_dapo``, ``math``, ``math_dapo_reasoning`` and every ``aime*`` source to its DAPO scorer
  (verl/utils/reward_score/math_dapo.py): only the last 300 characters count; the answer is the text after the
  last ``Answer:`` (case-insensitive) up to the end of its line; the result is ``{"score": 1.0 | -1.0, "acc":
  bool, "pred": str}``. :func:`math_dapo_compute_score` keeps that extraction and those values, and decides
  equality with math-verify where verl compares strings after its own normalisation (unit words, ``\\text{}``,
  ``\\dfrac``...). So it accepts every form verl accepts that is mathematically equal, plus equal forms written
  differently (``0.5`` for ``\\frac{1}{2}``, ``2\\sqrt{2}`` for ``\\sqrt{8}``).

math-verify bounds its parsing and comparison with ``signal.alarm`` (math_verify/utils.py ``timeout``), which only
works in the main thread; elsewhere we turn its timeout off instead of letting it raise.

No torch here; math-verify pulls in sympy and latex2sympy2_extended only, and is imported on first use.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

MATH_DATA_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
MATH_DAPO_DATA_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")
MATH_DAPO_PREFIX = "aime"  # verl: data_source.startswith("aime")
DAPO_CLIP_CHARS = 300
_ANSWER_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
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


def math_compute_score(data_source: str, solution_str: str, ground_truth: Any,
                       extra_info: Mapping[str, Any] | None = None, *, score: float = 1.0,
                       wrong_score: float = 0.0) -> float:
    """MATH / MATH-500 (verl's math-verify rule): ``score`` when the completion's answer is equivalent to the
    ground truth, else ``wrong_score``."""
    return float(score) if is_equivalent(solution_str, ground_truth) else float(wrong_score)


def extract_dapo_answer(solution_str: str) -> str | None:
    """The text after the last ``Answer:`` in the last :data:`DAPO_CLIP_CHARS` characters, or None."""
    found = _ANSWER_RE.findall(solution_str[-DAPO_CLIP_CHARS:])
    return found[-1] if found else None


def math_dapo_compute_score(data_source: str, solution_str: str, ground_truth: Any,
                            extra_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """DAPO-Math / AIME (verl's math_dapo rule, math-verify equality): 1.0 when the ``Answer:`` line equals the
    ground truth, -1.0 otherwise (also when there is no ``Answer:``)."""
    answer = extract_dapo_answer(solution_str)
    # An "Answer:" line is usually bare LaTeX ("2\\sqrt{2}"), which math-verify reads as LaTeX only inside math
    # delimiters or a box: box it unless it brings its own.
    text = answer if answer is None or "$" in answer or "\\boxed" in answer else "\\boxed{" + answer.strip() + "}"
    correct = text is not None and is_equivalent(text, ground_truth)
    # verl reports "[INVALID]" as the prediction when no "Answer:" is found.
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": answer.strip() if answer else "[INVALID]"}
