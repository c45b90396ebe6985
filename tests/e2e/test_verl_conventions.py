"""verl's conventions end to end on 2 ranks: save_every = -1 and test_freq = -1 (never: no checkpoint, not even the
final one, and no validation), a directory of Parquet files with a plain-text prompt column, truncation = "middle"
and filter_overlong_prompts, all through compile's data check and the job."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpcppo import metrics as hmetrics

from _harness import compile_run, launch_ranks, logs_of, wait_all, write_spec


def as_text_prompts(src, dst) -> int:
    """The tiny task's rows with the prompt column as plain text (the user message's content)."""
    table = pq.read_table(src)
    text = pa.array([m[0]["content"] for m in table.column("prompt").to_pylist()], pa.string())
    pq.write_table(table.set_column(table.schema.get_field_index("prompt"), "prompt", text), dst)
    return table.num_rows


@pytest.mark.slow
def test_minus_one_never_saves_nor_validates_and_text_prompts_in_a_folder_train(tmp_path, random_tiny):
    folder = tmp_path / "train"
    folder.mkdir()
    rows = as_text_prompts(random_tiny["train"], folder / "part-0.parquet")
    as_text_prompts(random_tiny["train"], folder / "part-1.parquet")
    spec = write_spec(tmp_path / "exp.toml", {**random_tiny, "train": folder})
    run = compile_run(spec, tmp_path / "runs", [
        "trainer.total_steps=3", "checkpoint.save_every=-1", "trainer.test_freq=-1", 'data.truncation="middle"',
        "data.filter_overlong_prompts=true",
    ])
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    df = hmetrics.load(run)
    assert list(df["step"]) == [1, 2, 3]
    val = [c for c in df.columns if c.startswith("val/")]
    assert val and df[val].isna().all().all()  # validation files are set, but -1 means never
    assert list(run.glob("checkpoints/step-*")) == []  # -1: not even the final checkpoint
    assert f"built: {2 * rows} train prompts" in logs_of(run)
