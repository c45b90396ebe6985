"""Reward functions: GSM8K scoring on the real data, dispatch, user functions, error messages."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcppo.data import rewards
from hpcppo.data.rewards import (
    RewardFunctionError,
    build_reward_fn,
    extract_gsm8k_answer,
    gsm8k_compute_score,
    score_batch,
)
from hpcppo.errors import ConfigError, PathError

GSM8K_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"
needs_gsm8k = pytest.mark.skipif(not (GSM8K_DIR / "test.jsonl").is_file(),
                                 reason=f"real GSM8K data not found at {GSM8K_DIR}")


def _gsm8k_test_rows() -> list[dict[str, str]]:
    with (GSM8K_DIR / "test.jsonl").open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _gold(answer: str) -> str:
    # Independent of the converter: the text after the last "####", commas dropped.
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def _completion(answer: str) -> str:
    """What a model trained on GSM8K writes: the worked answer without the calculator annotations."""
    return re.sub(r"<<[^>]*>>", "", answer)


def score(text: str, gt: str, **kw) -> float:
    return gsm8k_compute_score("openai/gsm8k", text, gt, None, **kw)


# --------------------------------------------------------------------------------------------- real GSM8K text

@needs_gsm8k
def test_every_gold_answer_scores_one_in_strict_and_flexible_mode():
    rows = _gsm8k_test_rows()
    assert len(rows) == 1319
    fn = build_reward_fn("auto")
    flexible = build_reward_fn("gsm8k", method="flexible")
    strict_scores = score_batch(fn, ["openai/gsm8k"] * len(rows), [r["answer"] for r in rows],
                                [_gold(r["answer"]) for r in rows], [None] * len(rows))
    assert strict_scores == [1.0] * len(rows)
    assert all(flexible("openai/gsm8k", _completion(r["answer"]), _gold(r["answer"])) == 1.0 for r in rows)


@needs_gsm8k
def test_realistic_completions_strict_vs_flexible():
    rows = _gsm8k_test_rows()[:50]
    for r in rows:
        gold = _gold(r["answer"])
        body = _completion(r["answer"]).rsplit("####", 1)[0].rstrip()
        # A model that states the answer in prose but forgets the "####" line: only flexible gives credit.
        prose = f"{body}\nSo the answer is {int(gold):,}."
        assert score(prose, gold, method="strict") == 0.0
        assert score(prose, gold, method="flexible") == 1.0
        # strict is verl's string rule: thousands commas are dropped, "18.00" and "18." are answers that are not
        # "18" (format_score), "$18" is no answer at all (0); flexible reads every one of them as the number.
        for shown, strict in ((f"{int(gold):,}", 1.0), (f"{gold}.00", 0.5), (f"{gold}.", 0.5), (f"${gold}", 0.0)):
            text = f"{body}\n#### {shown}"
            assert score(text, gold, method="strict", format_score=0.5) == strict, shown
            assert score(text, gold, method="flexible", format_score=0.5) == 1.0, shown
        # A wrong final answer: format_score in strict mode (the format was right), 0 by default.
        wrong = f"{body}\n#### {int(gold) + 1}"
        assert score(wrong, gold) == 0.0
        assert score(wrong, gold, format_score=0.1) == 0.1
        assert score(wrong, gold, score=2.0) == 0.0


def test_verl_conventions_kept():
    # No answer at all: 0, even with a format score (verl returns 0 when nothing is extracted).
    assert score("I do not know.", "18", format_score=0.1) == 0.0
    assert score("I do not know.", "18", method="flexible", format_score=0.1) == 0.0
    # Strict takes the LAST "#### <number>", flexible the last number of any form.
    assert score("#### 17\nwait, recheck\n#### 18", "18") == 1.0
    assert score("#### 18\nCheck: 18 / 2 = 9", "18") == 1.0
    assert score("#### 18\nCheck: 18 / 2 = 9", "18", method="flexible") == 0.0
    # Only the last 300 characters are read.
    assert score("#### 18\n" + "x" * 300, "18") == 0.0
    assert score("#### 18\n" + "x" * 280, "18") == 1.0
    assert len(extract_gsm8k_answer("1" * 1000, "flexible")) == 300
    # The score parameter is what a correct answer gets.
    assert score("#### 18", "18", score=2.5) == 2.5


@pytest.mark.parametrize(
    ("text", "strict", "flexible"),
    [
        ("#### 18", "18", "18"),
        ("#### -5", "-5", "-5"),
        ("#### $-5", None, "-5"),  # verl's character class has no "$"
        ("#### $18", None, "18"),
        ("The total is -$5.", None, "-5"),
        ("####18", None, "18"),  # verl wants exactly one space after ####
        ("####  18", None, "18"),
        ("####\t18", None, "18"),
        ("##### 18", "18", "18"),
        ("#### 18.00", "18.00", "18.00"),  # kept as written: strict compares strings
        ("#### 18.", "18.", "18"),
        ("#### 1.2.3", "1.2.3", ".3"),
        ("#### 1,2,3", "123", "3"),  # verl drops every comma
        ("#### 5-3", "5", "3"),
        ("#### --5", None, "-5"),
        ("#### -", None, None),
        ("#### 17\n#### 18", "18", "18"),
        ("#### 1,000,000 dollars", "1000000", "1000000"),
        ("#### .5", ".5", ".5"),
        ("3-4", None, "4"),  # subtraction, not a negative number
        ("x = -4", None, "-4"),
        ("1,2,3", None, "3"),  # a list, not 123
        ("#### ٣", None, None),  # non-ASCII digits are not numbers here
        ("####", None, None),
        ("", None, None),
        ("$", None, None),
        ("#### ,.,", ".", None),  # verl: the run ",.," minus its commas
    ],
)
def test_extraction_on_tricky_strings(text, strict, flexible):
    assert extract_gsm8k_answer(text, "strict") == strict
    assert extract_gsm8k_answer(text, "flexible") == flexible


def test_strict_compares_strings_as_verl_and_flexible_compares_numbers():
    for text, gt in (("#### 18.0", "18"), ("#### 18", "18.00"), ("#### 1000", "1,000"), ("#### 18", "$18"),
                     ("#### 0", "-0"), ("The answer: 18.0", "18")):
        assert score(text, gt, method="strict", format_score=0.5) == (0.0 if "####" not in text else 0.5), text
        assert score(text, gt, method="flexible", format_score=0.5) == 1.0, text
    for text in ("#### 18.5", "#### 180", "#### -18"):
        assert score(text, "18", format_score=0.5) == 0.5
        assert score(text, "18", method="flexible", format_score=0.5) == 0.5
    # verl compares with ==: a ground truth stored as a number never equals the extracted string.
    assert score("#### 18", 18, format_score=0.5) == 0.5
    assert score("#### 18", 18, method="flexible") == 1.0
    # A ground truth that is not a number: string equality of the extracted answer in both modes.
    assert score("#### 18", "eighteen") == 0.0
    assert score("#### 1,000", "1000") == 1.0  # commas go before the comparison


@settings(max_examples=300, deadline=None)
@given(st.text(), st.text())
def test_never_crashes_on_odd_text(text, ground_truth):
    for method in ("strict", "flexible"):
        value = score(text, ground_truth, method=method, format_score=0.25)
        assert value in (0.0, 0.25, 1.0)


@settings(max_examples=200, deadline=None)
@given(st.text(), st.integers(min_value=-10**9, max_value=10**9))
def test_appended_final_answer_is_found_after_any_text(prefix, n):
    assert score(prefix + f"\n#### {n}", str(n)) == 1.0
    assert score(prefix + f"\nThe answer is {n:,}.", str(n), method="flexible") == 1.0


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-10**12, max_value=10**12),
       st.sampled_from([("{n}", 1.0), ("{n:,}", 1.0), ("${n:,}", 0.0), ("{n}.00", 0.5), ("{n}.", 0.5)]))
def test_number_formats_strict_as_verl_flexible_numeric(n, case):
    fmt, strict = case
    text = "#### " + fmt.format(n=n)
    assert score(text, str(n), format_score=0.5) == strict
    assert score(text, str(n + 1), format_score=0.5) == (0.0 if strict == 0.0 else 0.5)
    assert score(text, str(n), method="flexible") == 1.0


# --------------------------------------------------------------------------------------------- dispatch

def test_auto_dispatches_by_data_source_and_lists_known_ones():
    fn = build_reward_fn("auto")
    assert fn("openai/gsm8k", "#### 3", "3", {"split": "test"}) == 1.0
    with pytest.raises(ConfigError) as err:
        fn("my/dataset", "\\boxed{3}", "3", None)
    msg = str(err.value)
    assert msg.startswith("data.reward_fn: no built-in reward for data_source 'my/dataset'")
    for known in ("openai/gsm8k", "hpcppo/arith", "lighteval/MATH", "HuggingFaceH4/MATH-500", "math_dapo", "aime*"):
        assert known in msg
    assert 'set data.reward_fn = "module:function"' in msg
    with pytest.raises(ConfigError, match="did you mean 'openai/gsm8k'"):
        fn("openai/gsm8", "#### 3", "3", None)


def test_auto_options_per_builtin():
    fn = build_reward_fn("auto", gsm8k={"method": "flexible", "format_score": 0.1})
    assert fn("openai/gsm8k", "so 3 apples", "3") == 1.0
    assert fn("openai/gsm8k", "so 4 apples", "3") == 0.1
    with pytest.raises(ConfigError, match="unknown built-in.*gsm9k.*known: gsm8k, arith"):
        build_reward_fn("auto", gsm9k={})
    with pytest.raises(ConfigError, match="unknown method 'loose'; allowed: strict, flexible"):
        build_reward_fn("auto", gsm8k={"method": "loose"})


def test_arith_is_imported_lazily_and_dispatched(tmp_path, monkeypatch):
    # The synthetic task's module is loaded only when a row of that data_source is scored.
    assert rewards.BUILTINS["arith"] == "hpcppo.data.synthetic:score_with_pred"
    (tmp_path / "fake_arith_mod.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(solution_str.strip() == ground_truth)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(rewards.BUILTINS, "arith", "fake_arith_mod:compute_score")
    fn = build_reward_fn("auto")
    fn("openai/gsm8k", "#### 1", "1")
    assert "fake_arith_mod" not in sys.modules
    assert fn("hpcppo/arith", " 7 ", "7") == 1.0
    assert fn("hpcppo/arith", "8", "7") == 0.0
    assert "fake_arith_mod" in sys.modules
    monkeypatch.delitem(sys.modules, "fake_arith_mod")


def test_arith_dispatch_reaches_the_synthetic_module():
    synthetic = pytest.importorskip("hpcppo.data.synthetic", reason="hpcppo/data/synthetic.py not present")
    fn = build_reward_fn("auto")
    for text, gt in (("#### 12", "12"), ("12", "12"), ("the answer is 13", "12"), ("", "0")):
        assert fn("hpcppo/arith", text, gt, None) == float(synthetic.compute_score("hpcppo/arith", text, gt, None))


def test_builtin_spec_binds_options_and_checks_them():
    fn = build_reward_fn("gsm8k", method="flexible")
    assert fn("anything", "it is 1,000.", "1000") == 1.0  # an explicit built-in ignores the data_source
    with pytest.raises(ConfigError, match="unexpected keyword argument 'bogus'"):
        build_reward_fn("gsm8k", bogus=1)
    with pytest.raises(ConfigError, match="not a built-in .*auto, gsm8k, arith.*package.module:function"):
        build_reward_fn("gsm8")


# --------------------------------------------------------------------------------------------- user functions

USER_MODULE = '''
CALLS = []

def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    CALLS.append((data_source, solution_str, ground_truth, extra_info))
    return float(solution_str == ground_truth) + bonus

def as_dict(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 0.5, "acc": True}

def returns_text(data_source, solution_str, ground_truth, extra_info=None):
    return "1.0"

def returns_nan(data_source, solution_str, ground_truth, extra_info=None):
    return float("nan")

def divides(data_source, solution_str, ground_truth, extra_info=None):
    return 1 / int(solution_str)

def two_args(solution_str, ground_truth):
    return 1.0

def positional_names(ds, sol, gt, info):
    return 1.0

NOT_A_FUNCTION = 3
'''


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(USER_MODULE)
    return path


def test_user_function_from_file_and_module(user_file, monkeypatch):
    fn = build_reward_fn(f"{user_file}:compute_score", bonus=0.5)
    assert fn("my/src", "abc", "abc", {"k": 1}) == 1.5
    assert fn("my/src", "abc", "abd", None) == 0.5
    monkeypatch.syspath_prepend(str(user_file.parent))
    monkeypatch.delitem(sys.modules, "my_reward", raising=False)
    by_module = build_reward_fn("my_reward:compute_score")
    assert by_module("my/src", "x", "x", None) == 1.0
    assert sys.modules["my_reward"].CALLS == [("my/src", "x", "x", None)]
    monkeypatch.delitem(sys.modules, "my_reward")
    # verl's convention: a dict with "score" is accepted
    assert build_reward_fn(f"{user_file}:as_dict")("s", "a", "b", None) == 0.5


def test_user_function_errors_say_what_is_wrong(user_file, tmp_path):
    with pytest.raises(ConfigError) as err:
        build_reward_fn(f"{user_file}:compute_scor")
    assert "has no attribute 'compute_scor'" in str(err.value)
    assert "compute_score" in str(err.value) and "did you mean 'compute_score'" in str(err.value)
    with pytest.raises(ConfigError, match="'NOT_A_FUNCTION' is a int, not callable"):
        build_reward_fn(f"{user_file}:NOT_A_FUNCTION")
    with pytest.raises(ConfigError) as err:
        build_reward_fn(f"{user_file}:two_args")
    assert "(solution_str, ground_truth)" in str(err.value)
    assert "fn(data_source=, solution_str=, ground_truth=, extra_info=)" in str(err.value)
    with pytest.raises(ConfigError, match=r"signature \(ds, sol, gt, info\).*missing a required argument: 'ds'"):
        build_reward_fn(f"{user_file}:positional_names")
    with pytest.raises(ConfigError, match="plus bonsu=.*unexpected keyword argument 'bonsu'"):
        build_reward_fn(f"{user_file}:compute_score", bonsu=1.0)
    with pytest.raises(PathError, match="does not exist"):
        build_reward_fn(f"{tmp_path}/nope.py:compute_score")
    with pytest.raises(ConfigError, match="no module named 'no_such_reward_pkg'.*PYTHONPATH"):
        build_reward_fn("no_such_reward_pkg.scores:compute_score")
    broken = tmp_path / "broken.py"
    broken.write_text("import math\nraise RuntimeError('needs a GPU')\n")
    with pytest.raises(ConfigError, match="importing .*broken.py failed: RuntimeError: needs a GPU"):
        build_reward_fn(f"{broken}:compute_score")


def test_score_batch_surfaces_the_failing_row(user_file):
    fn = build_reward_fn(f"{user_file}:divides")
    assert score_batch(fn, ["a", "b"], ["1", "4"], ["", ""], None) == [1.0, 0.25]
    with pytest.raises(RewardFunctionError) as err:
        score_batch(fn, ["a", "my/src"], ["2", "0"], ["", ""], [None, None])
    msg = str(err.value)
    assert "row 1" in msg and "'my/src'" in msg and "ZeroDivisionError" in msg and "divides" in msg
    assert isinstance(err.value.__cause__, ZeroDivisionError)
    with pytest.raises(RewardFunctionError, match="returned '1.0' \\(str\\) for data_source 'a' on row 0"):
        score_batch(build_reward_fn(f"{user_file}:returns_text"), ["a"], ["x"], ["x"])
    with pytest.raises(RewardFunctionError, match="returned nan for data_source 'z' on row 0"):
        score_batch(build_reward_fn(f"{user_file}:returns_nan"), ["z"], ["x"], ["x"])
    with pytest.raises(ValueError, match="lengths differ"):
        score_batch(fn, ["a", "b"], ["1"], ["", ""])


def test_score_batch_with_plain_function_and_unknown_source():
    # Any callable with the four-argument signature works, and its results are checked too.
    assert score_batch(lambda ds, s, g, e: 1, ["x"], ["a"], ["a"]) == [1.0]
    with pytest.raises(RewardFunctionError, match="returned inf"):
        score_batch(lambda ds, s, g, e: math.inf, ["x"], ["a"], ["a"])
    with pytest.raises(ConfigError, match="no built-in reward for data_source 'mystery'") as err:
        score_batch(build_reward_fn(), ["openai/gsm8k", "mystery"], ["#### 1", "1"], ["1", "1"])
    assert any("row 1" in note for note in err.value.__notes__)


def test_reward_errors_name_the_spec_keys():
    with pytest.raises(ConfigError) as err:
        build_reward_fn("auto")("lighteval/MATHS", "3", "3", None)
    assert err.value.key == "data.reward_fn"
    assert str(err.value).startswith("data.reward_fn: no built-in reward for data_source 'lighteval/MATHS'")
    assert str(err.value).endswith("(did you mean 'lighteval/MATH'? or set data.reward_fn = \"module:function\" "
                                   "(or \"path/to/file.py:function\") to score it yourself)")
    with pytest.raises(ConfigError) as err:
        build_reward_fn("auto", gsm8k={"method": "loose"})
    assert str(err.value) == "data.gsm8k_method: unknown method 'loose'; allowed: strict, flexible"
    with pytest.raises(ConfigError) as err:
        build_reward_fn("nocolon")
    assert err.value.key == "data.reward_fn"
