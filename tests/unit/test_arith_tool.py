"""The tool-use task (hpcppo.data.arith_tool): its rows and its final-answer reward."""

from __future__ import annotations

import pytest

from hpcppo.data import arith_tool
from hpcppo.data.rewards import build_reward_fn
from hpcppo.tiny.tokenizer import SPECIAL_TOKENS

RIGHT = "<call>calculator(123*456)</call><|tool|>56088<|assistant|>56088"


def test_rows_are_3_digit_products_deterministic_and_disjoint_by_split() -> None:
    train = arith_tool.generate_rows(300, seed=3, split="train")
    assert train == arith_tool.generate_rows(300, seed=3, split="train")
    val = arith_tool.generate_rows(100, seed=3, split="val")
    assert {r["extra_info"]["question"] for r in train}.isdisjoint(r["extra_info"]["question"] for r in val)
    for row in train + val:
        a, b = row["extra_info"]["operands"]
        assert 100 <= a <= 999 and 100 <= b <= 999
        assert row["prompt"] == [{"role": "user", "content": f"{a}*{b}="}]
        assert row["reward_model"]["ground_truth"] == str(a * b) and row["data_source"] == "hpcppo/arith-tool"
    assert arith_tool.generate_rows(5, seed=4, split="train") != arith_tool.generate_rows(5, seed=3, split="train")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"min_operand": 5, "max_operand": 5}, "0 <= min_operand < max_operand"),
    ({"split": "dev"}, "split must be one of train, val, test"),
    ({"val_fraction": 1.0}, r"val_fraction must be in \(0, 1\)"),
])
def test_bad_task_settings_are_refused(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        arith_tool.generate_rows(1, seed=0, **kwargs)


@pytest.mark.parametrize(("response", "score"), [
    (RIGHT, 1.0),
    (RIGHT + " \n", 1.0),                                    # whitespace around the number
    ("56088", 1.0),                                          # one turn: the response is the final turn
    ("<call>calculator(123*456)</call><|tool|>56088<|assistant|>56087", 0.0),
    ("<call>calculator(123*456)</call><|tool|>56088", 0.0),  # the answer seen in the tool turn, never given
    ("<call>calculator(123*456)</call>", 0.0),               # a call and no answer (the tool disabled)
    ("56088<|assistant|>56088x", 0.0),                       # the final turn must be the number alone
    ("<|assistant|>", 0.0),
    ("", 0.0),
    ("9" * 40, 0.0),
])
def test_the_reward_reads_the_last_assistant_turn_only(response, score) -> None:
    assert arith_tool.compute_score("hpcppo/arith-tool", response, "56088") == score


def test_auto_dispatch_scores_the_task_with_its_pred() -> None:
    fn = build_reward_fn("auto")
    assert fn("hpcppo/arith-tool", RIGHT, "56088") == 1.0
    assert fn.raw("hpcppo/arith-tool", RIGHT, "56088") == {"score": 1.0, "pred": "56088"}
    assert build_reward_fn("arith_tool")("hpcppo/arith-tool", "1", "56088") == 0.0
    with pytest.raises(ValueError, match="ground_truth must be an integer string"):
        arith_tool.compute_score("hpcppo/arith-tool", "1", "x")


def test_the_marker_is_the_tiny_templates_assistant_marker() -> None:
    assert arith_tool.ASSISTANT_MARKER in SPECIAL_TOKENS
