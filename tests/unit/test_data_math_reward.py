"""MATH scorers with verl's data_source names: math-verify equivalence (data.reward_fn = "math_verify") on real
MATH-style answers, verl's string-normalising MATH and DAPO rules ("auto", "math", "math_dapo"), dispatch by
data_source as verl's default_compute_score, and the thread rule of math-verify's timeout."""

from __future__ import annotations

import threading

import pytest

from hpcppo.data import math_reward
from hpcppo.data.math_reward import math_verify_compute_score
from hpcppo.data.math_verl import hendrycks_score, minerva_score
from hpcppo.data.rewards import build_reward_fn, builtin_for, score_batch

MATH = "HuggingFaceH4/MATH-500"


def math_score(text: str, gt: str) -> float:
    return math_verify_compute_score(MATH, text, gt, None)


# Completions as models write them for MATH problems (the final answer boxed) against MATH's ground truths.
EQUIVALENT = [
    ("So the probability is $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
    ("Thus the answer is $\\boxed{0.5}$.", "\\frac12"),  # decimal vs the shorthand \frac12
    ("$\\boxed{\\dfrac{3}{4}}$", "\\frac{3}{4}"),  # \dfrac vs \frac
    ("The side is $\\boxed{12\\text{ cm}}$.", "12"),  # units in \text{}
    ("The perimeter is \\boxed{12 \\text{ cm}}", "12\\text{ cm}"),
    ("The solution set is $\\boxed{(-\\infty, 3]}$.", "(-\\infty,3]"),  # an interval
    ("$x \\in \\boxed{[2, 5)}$", "[2,5)"),
    ("The minimum is $\\boxed{-7}$.", "-7"),  # negative numbers
    ("Simplifying, $\\boxed{2\\sqrt{2}}$.", "\\sqrt{8}"),
    ("so $\\boxed{1,\\!000}$ ways", "1000"),
    ("The roots are $\\boxed{2, -3}$.", "-3, 2"),
    ("We get $\\boxed{\\frac{-1}{3}}$", "-\\frac{1}{3}"),
    ("First $\\boxed{4}$, but rechecking, $\\boxed{5}$.", "5"),  # the last math segment wins
]
NOT_EQUIVALENT = [
    ("The solution set is $\\boxed{(-\\infty, 3)}$.", "(-\\infty,3]"),  # open vs closed end
    ("The minimum is $\\boxed{7}$.", "-7"),  # the sign matters
    ("$\\boxed{\\frac{2}{3}}$", "\\frac{3}{4}"),
    # Two boxes in one segment are read by math-verify as the set {4, 5}, which is not 5 (verl's rule too).
    ("\\boxed{5}, no wait, \\boxed{4}", "5"),
    ("First \\boxed{4}, but rechecking, \\boxed{5}", "5"),
    ("", "5"),
    ("I cannot solve this.", "\\frac{1}{2}"),
]


@pytest.mark.parametrize(("text", "gt"), EQUIVALENT)
def test_math_equivalent_answers_score_one(text, gt):
    assert math_score(text, gt) == 1.0


@pytest.mark.parametrize(("text", "gt"), NOT_EQUIVALENT)
def test_math_wrong_or_missing_answers_score_zero(text, gt):
    assert math_score(text, gt) == 0.0


def test_math_unparsable_ground_truth_scores_zero_not_raises():
    # verl's math_verify scorer catches everything math-verify raises and scores 0; so do we.
    assert math_score("\\boxed{3}", "\\frac{") == 0.0
    assert math_score("\\boxed{3}", "") == 0.0


def test_dapo_extraction_and_scores_as_verl():
    # verl's math_dapo: the last "Answer:" (any case) in the last 300 characters, to the end of its line, through
    # the Minerva normalisation on both sides; -1 when wrong or missing ("[INVALID]" as the prediction).
    assert minerva_score("math_dapo", "work...\nAnswer: 42\n", "42") == {"score": 1.0, "acc": True, "pred": "42"}
    assert minerva_score("math", "answer:1\nANSWER :  $\\frac{1}{2}$", "\\frac{1}{2}")["acc"] is True
    assert minerva_score("math", "Answer: 1\n" + "x" * 300, "1")["pred"] == "[INVALID]"
    assert minerva_score("aime2024", "Answer: 41", "42") == {"score": -1.0, "acc": False, "pred": "41"}
    assert minerva_score("math", "\\boxed{42}", "42") == {"score": -1.0, "acc": False, "pred": "[INVALID]"}
    # strings, not mathematics: what math-verify would accept, verl's DAPO rule does not
    assert minerva_score("math", "Answer: 2\\sqrt{2}", "\\sqrt{8}")["acc"] is False
    assert minerva_score("math", "Answer: $\\frac{1}{2}$", "0.5")["acc"] is False
    # its normalisation: units, \text{}, thousands commas, "x = "
    assert minerva_score("math", "Answer: 1,000 dollars", "1000")["acc"] is True
    assert minerva_score("math", "Answer: x = \\text{(B)}", "(B)")["acc"] is True
    # strict_box_verify: the last box of the last 100 characters, as written
    assert minerva_score("math", "so \\boxed{7}", "7", strict_box_verify=True)["acc"] is True
    assert minerva_score("math", "so \\boxed{7.0}", "7", strict_box_verify=True)["acc"] is False


# The pairs of issue 22 on which math-verify says 1 and verl's default MATH scorer says 0 (verl's math_reward at
# b178a3c: the last box, Hendrycks' string normalisation, string equality), and forms verl's normalisation accepts.
VERL_MATH_ZERO = [
    ("\\boxed{\\{3,2,1\\}}", "\\{1,2,3\\}"), ("\\boxed{\\$18.00}", "18"), ("\\boxed{1,000}", "1000"),
    ("\\boxed{2\\sqrt2}", "\\sqrt8"), ("\\boxed{x^2+2x+1}", "(x+1)^2"), ("\\boxed{B}", "\\text{(B)}"),
    ("The answer is 42.", "42"), ("\\boxed{\\frac{-1}{2}}", "-\\frac12"),
    ("\\fbox{5}", "5"),  # verl finds the \fbox but cannot unbox it: 0
]
VERL_MATH_ONE = [
    ("\\boxed{\\dfrac{1}{2}}", "\\frac12"), ("\\boxed{0.5}", "\\frac{1}{2}"), ("\\boxed{3/4}", "\\frac{3}{4}"),
    ("\\boxed{\\sqrt3}", "\\sqrt{3}"), ("\\boxed{x = 5}", "5"), ("\\boxed{12 \\text{ cm}}", "12"),
    ("\\boxed{90^\\circ}", "90"), ("\\boxed{.5}", "0.5"), ("\\boxed 7$ done", "7"), ("\\boxed{50\\%}", "50"),
    ("$\\boxed{4}$ then $\\boxed{5}$", "5"),  # the last box
]


@pytest.mark.parametrize(("text", "gt"), VERL_MATH_ZERO)
def test_auto_scores_math_sources_as_verls_default_zero(text, gt):
    assert hendrycks_score(MATH, text, gt) == 0.0
    assert score_batch(build_reward_fn("auto"), ["DigitalLearningGmbH/MATH-lighteval"], [text], [gt]) == [0.0]


@pytest.mark.parametrize(("text", "gt"), VERL_MATH_ONE)
def test_auto_scores_math_sources_as_verls_default_one(text, gt):
    assert hendrycks_score(MATH, text, gt) == 1.0


def test_math_verify_by_name_keeps_math_verify():
    fn = build_reward_fn("math_verify")
    assert fn("DigitalLearningGmbH/MATH-lighteval", "\\boxed{2\\sqrt2}", "\\sqrt8") == 1.0
    assert fn("lighteval/MATH", "\\boxed{\\frac{-1}{2}}", "-\\frac12") == 1.0


def test_dispatch_uses_verl_data_source_names():
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
        assert builtin_for(source) == "math"
    for source in ("math_dapo", "math", "math_dapo_reasoning", "aime2024", "aime_2025"):
        assert builtin_for(source) == "math_dapo"
    assert builtin_for("openai/gsm8k") == "gsm8k" and builtin_for("Aime") is None
    fn = build_reward_fn("auto")
    sources = ["lighteval/MATH", "aime2024", "openai/gsm8k", "math_dapo"]
    texts = ["\\boxed{\\frac{1}{2}}", "Answer: 12", "#### 7", "Answer: 3"]
    assert score_batch(fn, sources, texts, ["0.5", "12", "7", "4"]) == [1.0, 1.0, 1.0, -1.0]
    # The same built-ins by name, for every row.
    assert build_reward_fn("math")("anything", "\\boxed{-7}", "-7") == 1.0
    assert build_reward_fn("math_dapo")("anything", "Answer: -7", "-7") == 1.0


@pytest.mark.parametrize(("source", "scorer"), [("numina_olympiads", "prime_math"), ("codecontests", "prime_code"),
                                                ("hiyouga/geometry3k", "geo3k"), ("searchR1_nq", "search_r1"),
                                                ("my_source", None)])
def test_auto_refuses_what_verl_scores_with_code_hpcppo_lacks(source, scorer):
    from hpcppo.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        build_reward_fn("auto")(source, "\\boxed{1}", "1")
    text = str(err.value)
    assert "data.reward_fn" in text and (scorer is None or scorer in text), text


def test_scorers_work_off_the_main_thread():
    # math-verify's timeout uses signal.alarm, which raises off the main thread: we turn the timeout off there.
    results: list[float] = []
    worker = threading.Thread(target=lambda: results.append(math_score("\\boxed{\\frac{1}{2}}", "0.5")))
    worker.start()
    worker.join()
    assert results == [1.0]
    assert math_reward._timeout() == math_reward.TIMEOUT_S  # and keep it on the main thread
