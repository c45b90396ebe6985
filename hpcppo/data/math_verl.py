"""verl's string-normalising math scorers, rule for rule, so that ``data.reward_fn = "auto"`` scores as verl's
``default_compute_score`` does (verl/utils/reward_score/__init__.py, volcengine/verl b178a3c).

- :func:`hendrycks_score`: verl's ``math_reward.compute_score`` (MATH: ``lighteval/MATH``,
  ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500``): the last ``\\boxed{...}`` (or ``\\boxed x``,
  or ``\\fbox{...}``, which verl then cannot unbox and scores 0), both sides through the Hendrycks MATH string
  normalisation (``strip_string``), equal strings score 1.0, else 0.0. ``{3,2,1}`` is not ``{1,2,3}``, ``1,000`` is
  not ``1000``, an unboxed answer scores 0.
- :func:`minerva_score`: verl's ``math_dapo.compute_score`` (``math_dapo``, ``math``, ``math_dapo_reasoning``,
  ``aime*``): in the last 300 characters, the text after the last ``Answer:`` through the Minerva normalisation
  (``normalize_final_answer``) against the normalised ground truth; ``{"score": 1.0 | -1.0, "acc", "pred"}``.
  ``strict_box_verify=True``: the last ``\\boxed{}`` in the last 100 characters must equal the ground truth as is.

Written from verl's rules (its own code adapts lm-evaluation-harness); where verl's helpers raise (an assertion, an
index past the end) the same inputs take the same fallback here: ``is_equiv`` compares the raw strings,
``compute_score`` scores 0. No torch, no sympy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["hendrycks_score", "hendrycks_normalize", "last_boxed", "minerva_score", "minerva_normalize"]


class _Fallback(Exception):
    """Where verl's helper raises: the caller takes verl's except branch."""


# ------------------------------------------------------------------------------------------------ boxes

def _brace_end(text: str, start: int) -> int | None:
    """Index of the ``}`` that brings the brace depth counted from ``start`` back to zero, or None."""
    depth = 0
    for k in range(start, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return None


def last_boxed(text: str) -> str | None:
    """verl math_reward.last_boxed_only_string: ``\\boxed x`` (up to a ``$``) when the text has a ``\\boxed ``,
    else the last ``\\boxed{...}``, else the last ``\\fbox{...}``, braces balanced; None when there is none."""
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    end = _brace_end(text, start)
    return None if end is None else text[start:end + 1]


def _unbox(boxed: str) -> str:
    """verl math_reward.remove_boxed; raises :class:`_Fallback` where verl's assertions fail (``\\fbox{}``)."""
    if "\\boxed " in boxed:
        if not boxed.startswith("\\boxed "):
            raise _Fallback
        return boxed[len("\\boxed "):]
    if not (boxed.startswith("\\boxed{") and boxed.endswith("}")):
        raise _Fallback
    return boxed[len("\\boxed{"):-1]


# ------------------------------------------------------------------------------------------------ Hendrycks MATH

# (text, replacement) in verl's order (math_reward.strip_string), up to the unit removal.
_HENDRYCKS_BEFORE_UNITS = (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"),
                           ("\\left", ""), ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", ""))
_HENDRYCKS_AFTER_UNITS = (("\\\\%", ""), ("\\%", ""), (" .", " 0."), ("{.", "{0."))


def _sqrt_braces(text: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}`` (one character); raises :class:`_Fallback` on a ``\\sqrt`` at the very end."""
    head, *parts = text.split("\\sqrt")
    out = [head]
    for part in parts:
        if not part:
            raise _Fallback
        out.append("\\sqrt" + (part if part[0] == "{" else "{" + part[0] + "}" + part[1:]))
    return "".join(out)


def _frac_braces(text: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{2}`` -> ``\\frac{1}{2}``; the text unchanged when a ``\\frac`` is
    followed by a single character; raises :class:`_Fallback` on a ``\\frac`` at the very end."""
    head, *parts = text.split("\\frac")
    out = [head]
    for part in parts:
        if not part:
            raise _Fallback
        if part[0] == "{":
            out.append("\\frac" + part)
            continue
        if len(part) < 2:
            return text
        first, second, rest = part[0], part[1], part[2:]
        out.append("\\frac{" + first + "}" + ("{" + second + "}" + rest if second != "{" else second + rest))
    return "".join(out)


def _slash_fraction(text: str) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` when both sides are integers written plainly; else unchanged."""
    parts = text.split("/")
    if len(parts) != 2:
        return text
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return text
    return "\\frac{" + str(a) + "}{" + str(b) + "}" if text == f"{a}/{b}" else text


def hendrycks_normalize(text: str) -> str:
    """verl math_reward.strip_string; raises :class:`_Fallback` where verl's raises."""
    for old, new in _HENDRYCKS_BEFORE_UNITS:
        text = text.replace(old, new)
    if "\\text{ " in text:  # units on the right ("5 \\text{ cm}"): only the number is kept
        pieces = text.split("\\text{ ")
        if len(pieces) != 2:
            raise _Fallback
        text = pieces[0]
    for old, new in _HENDRYCKS_AFTER_UNITS:
        text = text.replace(old, new)
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "x = 3" -> "3"
        text = sides[1]
    text = _sqrt_braces(text).replace(" ", "")
    text = _frac_braces(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _slash_fraction(text)


def _hendrycks_equal(answer: str, truth: str) -> bool:
    try:
        return hendrycks_normalize(answer) == hendrycks_normalize(truth)
    except (_Fallback, IndexError, AttributeError, TypeError):
        return answer == truth  # verl's is_equiv: the raw strings when normalising fails


def hendrycks_score(data_source: str, solution_str: str, ground_truth: Any,
                    extra_info: Mapping[str, Any] | None = None) -> float:
    """verl's MATH score: 1.0 when the last box of the completion equals the ground truth after normalisation."""
    boxed = last_boxed(solution_str)
    if boxed is None:
        return 0.0
    try:
        answer = _unbox(boxed)
    except _Fallback:
        return 0.0
    if ground_truth is None:
        return 0.0
    return 1.0 if _hendrycks_equal(answer, ground_truth) else 0.0


# ------------------------------------------------------------------------------------------------ Minerva (DAPO)

# verl math_dapo.SUBSTITUTIONS and REMOVED_EXPRESSIONS, applied in this order.
_MINERVA_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
                    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_MINERVA_DROP = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
                 "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
                 "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
                 "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
                 ",\\!", "{,}", '"', "\\dots")
# (pattern, replacement) in verl's order: the first $...$ of a line, then the insides of \text{}, \textbf{},
# \overline{} (shortest) and \boxed{} (longest), then \fracab and \sqrta shorthand.
_MINERVA_PATTERNS = tuple((re.compile(p), r) for p, r in (
    (r".*?\$(.*?)\$.*", r"$\1$"),
    (r"\\text\{(.*?)\}", r"\1"),
    (r"\\textbf\{(.*?)\}", r"\1"),
    (r"\\overline\{(.*?)\}", r"\1"),
    (r"\\boxed\{(.*)\}", r"\1"),
    (r"frac([^{])(.)", r"frac{\1}{\2}"),
    (r"sqrt([^{])", r"sqrt{\1}"),
))
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
DAPO_TAIL_CHARS = 300
STRICT_TAIL_CHARS = 100


def minerva_normalize(text: str) -> str:
    """verl math_dapo.normalize_final_answer."""
    text = text.split("=")[-1]
    for old, new in _MINERVA_REPLACE:
        text = text.replace(old, new)
    for gone in _MINERVA_DROP:
        text = text.replace(gone, "")
    for pattern, replacement in _MINERVA_PATTERNS:
        text = pattern.sub(replacement, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def _strict_box(solution_tail: str, ground_truth: Any) -> tuple[bool, str | None]:
    """verl math_dapo.is_correct_strict_box: the last ``\\boxed{}`` of the last 100 characters, unnormalised."""
    tail = solution_tail[-STRICT_TAIL_CHARS:]
    start = tail.rfind("\\boxed{")
    end = _brace_end(tail, start) if start >= 0 else None
    pred = tail[start + len("\\boxed{"):end] if end is not None else None
    return pred == ground_truth, pred


def minerva_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: Mapping[str, Any] | None = None, *, strict_box_verify: bool = False) -> dict[str, Any]:
    """verl's DAPO score: 1.0 when the normalised ``Answer:`` equals the normalised ground truth, else -1.0."""
    tail = solution_str[-DAPO_TAIL_CHARS:]
    if strict_box_verify:
        correct, pred = _strict_box(tail, ground_truth)
    else:
        found = _ANSWER_LINE.findall(tail)
        pred = minerva_normalize(found[-1] if found else "[INVALID]")
        correct = pred == minerva_normalize(str(ground_truth))
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
