"""Reader: attempts, rollbacks (supersession), partial appends, column selection, path errors."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from hpcppo.errors import PathError
from hpcppo.metrics import MetricsWriter, UnknownColumnError, load, load_events, metric_files, superseded_mask

COLS = ("reward/mean", "kl/actor_ref")


def _write(run, attempt, steps, columns=COLS, value=lambda s, a: 100 * a + s):
    with MetricsWriter(run, columns, attempt=attempt) as w:
        for s in steps:
            w.log(s, {"reward/mean": value(s, attempt)})


def test_superseded_mask_is_later_row_at_or_before_this_step():
    assert superseded_mask(np.array([], np.int64)).tolist() == []
    assert superseded_mask(np.array([0, 1, 2])).tolist() == [False, False, False]
    # rollback from 4 to 2: old 2,3,4 abandoned, even 4 which the new branch has not reached yet
    assert superseded_mask(np.array([0, 1, 2, 3, 4, 2, 3])).tolist() == [
        False, False, True, True, True, False, False,
    ]
    # two rollbacks, the second to before the first
    assert superseded_mask(np.array([0, 1, 2, 1, 2, 0, 1])).tolist() == [
        True, True, True, True, True, False, False,
    ]
    # the same step twice in a row: the later row wins
    assert superseded_mask(np.array([5, 5])).tolist() == [True, False]


def test_attempts_are_concatenated_and_the_resumed_attempt_wins(tmp_path):
    _write(tmp_path, 1, range(0, 6))  # attempt 1 reached step 5 then died
    _write(tmp_path, 2, range(4, 8))  # resumed from the checkpoint of step 3
    df = load(tmp_path)
    assert df["step"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert df["attempt"].tolist() == [1, 1, 1, 1, 2, 2, 2, 2]
    assert df["reward/mean"].tolist() == [100, 101, 102, 103, 204, 205, 206, 207]
    every = load(tmp_path, all_rows=True)
    assert len(every) == 10
    assert every.loc[every["superseded"], ["attempt", "step"]].values.tolist() == [[1, 4], [1, 5]]
    assert every["superseded"].dtype == bool


def test_resumed_attempt_behind_the_old_one_hides_the_abandoned_tail(tmp_path):
    _write(tmp_path, 1, range(0, 10))
    _write(tmp_path, 2, range(5, 7))  # resumed at 5, so far reached 6; old 7..9 belong to an abandoned history
    df = load(tmp_path)
    assert df["step"].tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert df["attempt"].tolist() == [1] * 5 + [2] * 2
    assert load(tmp_path, all_rows=True)["superseded"].sum() == 5


def test_rollback_within_an_attempt_keeps_every_row_and_marks_the_abandoned_ones(tmp_path):
    with MetricsWriter(tmp_path, COLS, attempt=1) as w:
        for s in range(5):
            w.log(s, {"reward/mean": s})
        assert w.branch == 0
        w.log(3, {"reward/mean": 30})  # rollback to the checkpoint of step 2
        assert w.branch == 1
        w.log(4, {"reward/mean": 40})
        w.log_event(3, "rollback", "to step 2, lr x 0.5")
    df = load(tmp_path)
    assert df["step"].tolist() == [0, 1, 2, 3, 4]
    assert df["reward/mean"].tolist() == [0, 1, 2, 30, 40]
    assert df["branch"].tolist() == [0, 0, 0, 1, 1]
    assert df["seq"].tolist() == [0, 1, 2, 5, 6]
    every = load(tmp_path, all_rows=True)
    assert every["seq"].tolist() == list(range(7))
    assert every["step"].tolist() == [0, 1, 2, 3, 4, 3, 4]
    assert every["superseded"].tolist() == [False, False, False, True, True, False, False]
    assert load_events(tmp_path)["kind"].tolist() == ["rollback"]


def test_columns_differ_between_attempts(tmp_path):
    _write(tmp_path, 1, [0], columns=("reward/mean", "val/score/gsm8k"))
    _write(tmp_path, 2, [1], columns=("reward/mean", "val/score/math"))
    df = load(tmp_path)
    assert df.columns.tolist()[5:] == ["reward/mean", "val/score/gsm8k", "val/score/math"]
    assert df["val/score/math"].isna().all() and df["val/score/gsm8k"].isna().all()
    assert df["reward/mean"].tolist() == [100, 201]


def test_column_selection_and_unknown_column(tmp_path):
    _write(tmp_path, 1, [0, 1])
    df = load(tmp_path, columns=["kl/actor_ref"])
    assert df.columns.tolist() == ["step", "attempt", "branch", "seq", "time", "kl/actor_ref"]
    with pytest.raises(UnknownColumnError, match=r"unknown metric column 'reward/maen' \(did you mean 'reward/mean'"):
        load(tmp_path, columns=["reward/maen"])
    with pytest.raises(TypeError):
        load(tmp_path, columns="reward/mean")


def test_rows_are_read_up_to_the_shortest_dataset_and_unwritten_rows_are_dropped(tmp_path):
    """A reader arriving mid-append sees datasets of different lengths and not-yet-written rows (fill values)."""
    path = tmp_path / "metrics" / "attempt-0001.h5"
    _write(tmp_path, 1, range(3))
    with h5py.File(path, "a") as f:  # emulate the writer's state between two resizes
        f["step"].resize((5,))
        f["time"].resize((4,))
        f["values"].resize((4, 2))
        f["logged"].resize((4, 2))  # before seq, as the writer does
        f["branch"].resize((4,))
        f["attempt"].resize((4,))
        f["seq"].resize((4,))  # resized, but its value not yet written: still the fill value -1
    assert load(tmp_path)["step"].tolist() == [0, 1, 2]
    with h5py.File(path, "a") as f:
        f["seq"][3] = 3
        f["step"][3] = 3
    assert load(tmp_path)["step"].tolist() == [0, 1, 2]  # attempt, branch and time still unwritten
    with h5py.File(path, "a") as f:
        f["attempt"][3] = 1
        f["branch"][3] = 0
        f["time"][3] = f["time"][2]
    # the row is complete now ('step' is the only dataset with a 5th row); its values are not, so NaN
    df = load(tmp_path)
    assert df["step"].tolist() == [0, 1, 2, 3] and np.isnan(df["reward/mean"][3])


def test_run_without_metrics_yet_gives_an_empty_frame(tmp_path):
    (tmp_path / "metrics").mkdir()
    df = load(tmp_path)
    assert len(df) == 0 and df.columns.tolist() == ["step", "attempt", "branch", "seq", "time"]
    assert df["step"].dtype == np.int64
    assert load(tmp_path, all_rows=True).columns[-1] == "superseded"
    assert len(load_events(tmp_path)) == 0


def test_metric_files_order_by_attempt_number_and_skip_temporaries(tmp_path):
    for a in (10, 2):
        _write(tmp_path, a, [a])
    (tmp_path / "metrics" / ".attempt-0011.h5.123.tmp").write_bytes(b"")
    (tmp_path / "metrics" / "notes.txt").write_text("x")
    assert [p.name for p in metric_files(tmp_path)] == ["attempt-0002.h5", "attempt-0010.h5"]
    assert [p.name for p in metric_files(tmp_path / "metrics")] == ["attempt-0002.h5", "attempt-0010.h5"]
    one = tmp_path / "metrics" / "attempt-0010.h5"
    assert load(one)["step"].tolist() == [10]


def test_path_errors(tmp_path):
    with pytest.raises(PathError, match="no such run directory or metrics file"):
        load(tmp_path / "missing")
    other = tmp_path / "other.h5"
    with h5py.File(other, "w", libver="latest") as f:
        f["x"] = 1
    with pytest.raises(PathError, match="not an hpcppo metric log"):
        load(other)
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5 at all")
    with pytest.raises(PathError, match="cannot open the metric log"):
        load(junk)
