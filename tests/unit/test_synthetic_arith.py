"""The synthetic arithmetic task: rows, splits, Parquet schema (verl's) and the reward function."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcppo.data import synthetic


def test_rows_have_verls_fields_and_correct_answers() -> None:
    rows = synthetic.generate_rows(50, seed=3, split="train", max_operand=99, num_operands=3, operators=("+", "-"))
    assert len(rows) == 50
    for i, row in enumerate(rows):
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert row["data_source"] == "hpcppo/arith"
        assert row["ability"] == "arithmetic"
        assert row["prompt"] == [{"role": "user", "content": row["extra_info"]["question"]}]
        info = row["extra_info"]
        assert info["split"] == "train" and info["index"] == i
        assert len(info["operands"]) == 3 and len(info["operators"]) == 2
        assert all(0 <= v <= 99 for v in info["operands"])
        # recompute the answer independently of synthetic.evaluate
        expr = info["question"].rstrip("=")
        assert info["question"].endswith("=")
        assert eval(expr, {"__builtins__": {}}) == info["answer"]  # noqa: S307 - digits and +/- only
        assert row["reward_model"] == {"style": "rule", "ground_truth": str(info["answer"])}
    # with "-" in play some answers are negative, and both operators occur
    assert any(r["extra_info"]["answer"] < 0 for r in rows)
    assert {op for r in rows for op in r["extra_info"]["operators"]} == {"+", "-"}


def test_deterministic_in_seed_and_differs_across_seeds() -> None:
    a = synthetic.generate_rows(30, seed=1, split="train")
    b = synthetic.generate_rows(30, seed=1, split="train")
    c = synthetic.generate_rows(30, seed=2, split="train")
    assert a == b
    assert a != c
    # val and test draw from the same pool but are different draws
    assert synthetic.generate_rows(30, seed=1, split="val") != synthetic.generate_rows(30, seed=1, split="test")


def test_train_and_val_are_disjoint_for_any_seed() -> None:
    train = {r["extra_info"]["question"] for s in range(3) for r in synthetic.generate_rows(400, seed=s, split="train", max_operand=19)}
    val = {r["extra_info"]["question"] for s in range(3) for r in synthetic.generate_rows(200, seed=s, split="val", max_operand=19)}
    assert train and val
    assert not train & val
    # the pool a problem belongs to does not depend on the seed or on n
    assert all(synthetic.is_validation_problem(q, 0.1) for q in val)
    assert not any(synthetic.is_validation_problem(q, 0.1) for q in train)


def test_difficulty_is_dialled_by_max_operand() -> None:
    rows = synthetic.generate_rows(200, seed=0, split="train", max_operand=5)
    assert max(v for r in rows for v in r["extra_info"]["operands"]) <= 5
    big = synthetic.generate_rows(200, seed=0, split="train", max_operand=999)
    assert max(v for r in big for v in r["extra_info"]["operands"]) > 100


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"split": "dev"}, "split must be one of train, val, test"),
        ({"max_operand": 0}, "max_operand must be an integer >= 1"),
        ({"num_operands": 1}, "num_operands must be an integer >= 2"),
        ({"operators": ("*",)}, r"operators must be a non-empty subset of \('\+', '-'\)"),
        ({"operators": ()}, "operators must be a non-empty subset"),
        ({"val_fraction": 1.0}, r"val_fraction must be in \(0, 1\)"),
    ],
)
def test_bad_settings_raise_with_a_clear_message(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        synthetic.generate_rows(5, seed=0, **kwargs)


def test_empty_validation_pool_is_reported() -> None:
    # max_operand=1 gives 4 problems; with a tiny val_fraction none of them is a validation problem
    with pytest.raises(ValueError, match="pool is \\(nearly\\) empty"):
        synthetic.generate_rows(3, seed=0, split="val", max_operand=1, val_fraction=1e-9)


def test_parquet_schema_matches_verl(tmp_path) -> None:
    rows = synthetic.generate_rows(20, seed=0, split="val")
    path = synthetic.write_split(tmp_path / "sub" / "val.parquet", rows, metadata={"hpcppo_settings": "abc"})
    table = pq.read_table(path)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    schema = table.schema
    assert schema.field("data_source").type == pa.string()
    assert schema.field("ability").type == pa.string()
    prompt = schema.field("prompt").type
    assert pa.types.is_list(prompt)
    assert pa.types.is_struct(prompt.value_type)
    assert {f.name: f.type for f in prompt.value_type} == {"role": pa.string(), "content": pa.string()}
    rm = schema.field("reward_model").type
    assert {f.name: f.type for f in rm} == {"style": pa.string(), "ground_truth": pa.string()}
    extra = schema.field("extra_info").type
    assert pa.types.is_struct(extra)
    assert {"split", "index"} <= {f.name for f in extra}
    assert extra.field("index").type == pa.int64()
    # the rows come back exactly as generated, and the metadata is readable
    assert table.to_pylist() == rows
    assert synthetic.read_metadata(path) == {"hpcppo_settings": "abc"}
    # no temporary files are left beside the result
    assert sorted(p.name for p in path.parent.iterdir()) == ["val.parquet"]


def test_write_split_replaces_atomically(tmp_path) -> None:
    path = tmp_path / "train.parquet"
    synthetic.write_split(path, synthetic.generate_rows(5, seed=0, split="train"))
    ino = os.stat(path).st_ino
    synthetic.write_split(path, synthetic.generate_rows(7, seed=1, split="train"))
    assert pq.read_table(path).num_rows == 7
    assert os.stat(path).st_ino != ino  # a rename, not an in-place rewrite


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path) -> None:
    path = tmp_path / "train.parquet"
    rows = synthetic.generate_rows(5, seed=0, split="train")
    synthetic.write_split(path, rows)
    bad = [dict(rows[0], extra_info={**rows[0]["extra_info"], "index": "not an int"})]
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        synthetic.write_split(path, bad)
    assert pq.read_table(path).to_pylist() == rows
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.parquet"]


@pytest.mark.parametrize(
    ("solution", "truth", "score"),
    [
        ("95", "95", 1.0),
        ("  95  ", "95", 1.0),
        ("95<eos><pad><pad>", "95", 1.0),
        ("the answer is 95.", "95", 1.0),
        ("095", "95", 1.0),
        ("-3", "-3", 1.0),
        ("3", "-3", 0.0),
        ("96", "95", 0.0),
        ("195", "95", 0.0),
        ("9 5", "95", 0.0),  # first integer is 9
        ("12+7=19", "19", 0.0),  # first integer is 12: the prompt echoed is not an answer
        ("", "95", 0.0),
        ("   ", "95", 0.0),
        ("garbage!!", "95", 0.0),
        ("<eos>", "0", 0.0),
        ("9" * 5000, "9", 0.0),  # beyond Python's int-conversion limit: must not raise
        ("\x00\udcff 7", "7", 1.0),
    ],
)
def test_compute_score_cases(solution: str, truth: str, score: float) -> None:
    assert synthetic.compute_score("hpcppo/arith", solution, truth) == score


def test_compute_score_takes_verls_signature_and_odd_inputs() -> None:
    assert synthetic.compute_score(data_source="hpcppo/arith", solution_str="4", ground_truth="4", extra_info={"index": 0}) == 1.0
    assert synthetic.compute_score("hpcppo/arith", None, "4") == 0.0  # type: ignore[arg-type]
    assert synthetic.compute_score("hpcppo/arith", b"4", "4") == 0.0  # type: ignore[arg-type]
    assert synthetic.compute_score("hpcppo/arith", "4", " 4 ") == 1.0


def test_bad_ground_truth_is_a_data_error() -> None:
    with pytest.raises(ValueError, match="arith ground_truth must be an integer string, got 'four'"):
        synthetic.compute_score("hpcppo/arith", "4", "four")


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_compute_score_never_raises_on_any_text(text: str) -> None:
    assert synthetic.compute_score("hpcppo/arith", text, "42") in (0.0, 1.0)


@settings(max_examples=100, deadline=None)
@given(st.integers(-10**6, 10**6), st.text(alphabet=" \t\n<>eospad", max_size=8))
def test_compute_score_accepts_the_answer_with_trailing_specials(n: int, tail: str) -> None:
    assert synthetic.compute_score("hpcppo/arith", f" {n}{tail}", str(n)) == 1.0


def test_module_does_not_import_torch() -> None:
    code = "import sys, hpcppo.data.synthetic; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
