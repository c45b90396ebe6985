"""The analysis API: ``load(run, attempts=, branches=)`` with its ``current`` column, ``load_many`` and
``events`` (the HDF5 events and events.jsonl merged), on whole files, a live writer and a writer killed -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import hpcppo.metrics as hm
from hpcppo.metrics import MetricsWriter
from hpcppo.rundir.events import append_event

COLS = ("reward/mean", "kl/actor_ref")


def history(run):
    """Attempt 0: steps 0..5, a rollback to 3 (branch 1: 3..7), killed. Attempt 1 resumes at 6: 6..9."""
    with MetricsWriter(run, COLS, attempt=0) as w:
        for s in range(6):
            w.log(s, {"reward/mean": s})
        w.log_event(5, "watchdog.rollback", "to step 2")
        for s in range(3, 8):
            w.log(s, {"reward/mean": 10 + s})
    with MetricsWriter(run, COLS, attempt=1) as w:
        w.log_event(6, "resume", "resumed from checkpoint step 5")
        for s in range(6, 10):
            w.log(s, {"reward/mean": 100 + s})


def pairs(df):
    return list(zip(df["attempt"].tolist(), df["step"].tolist()))


def test_the_four_views_of_a_run_with_a_rollback_and_a_resume(tmp_path):
    history(tmp_path)
    default = hm.load(tmp_path)
    assert pairs(default) == [(0, s) for s in range(3)] + [(0, 3), (0, 4), (0, 5)] + [(1, s) for s in range(6, 10)]
    assert default["reward/mean"].tolist() == [0, 1, 2, 13, 14, 15, 106, 107, 108, 109]
    assert "current" not in default
    assert default.equals(hm.load(tmp_path, attempts="latest", branches="current"))

    every = hm.load(tmp_path, attempts="all", branches="all")
    assert len(every) == 6 + 5 + 4 and every.columns[-1] == "current" and every["current"].dtype == bool
    assert every.loc[every["current"], ["attempt", "step", "reward/mean"]].reset_index(drop=True).equals(
        default[["attempt", "step", "reward/mean"]])
    # abandoned by the rollback: old 3, 4, 5; redone by attempt 1: branch 1's 6, 7
    assert every.loc[~every["current"], ["attempt", "branch", "step"]].values.tolist() == [
        [0, 0, 3], [0, 0, 4], [0, 0, 5], [0, 1, 6], [0, 1, 7]]

    branches = hm.load(tmp_path, branches="all")  # rollback branches kept, attempt 1 wins where it re-logged
    assert pairs(branches) == [(0, s) for s in range(6)] + [(0, 3), (0, 4), (0, 5)] + [(1, s) for s in range(6, 10)]
    assert branches["current"].tolist() == [True] * 3 + [False] * 3 + [True] * 7

    attempts = hm.load(tmp_path, attempts="all")  # each attempt's own current history
    assert pairs(attempts) == [(0, s) for s in range(3)] + [(0, s) for s in range(3, 8)] + [(1, s) for s in range(6, 10)]
    assert attempts["current"].tolist() == [True] * 6 + [False] * 2 + [True] * 4

    legacy = hm.load(tmp_path, all_rows=True)
    assert legacy["superseded"].tolist() == (~every["current"]).tolist() and "current" not in legacy


def test_views_of_an_empty_run_have_the_flag_column(tmp_path):
    (tmp_path / "metrics").mkdir()
    df = hm.load(tmp_path, branches="all")
    assert len(df) == 0 and df.columns.tolist() == ["step", "attempt", "branch", "seq", "time", "current"]


def test_bad_view_names_are_value_errors(tmp_path):
    history(tmp_path)
    with pytest.raises(ValueError, match="attempts must be one of 'latest', 'all', not 'every'"):
        hm.load(tmp_path, attempts="every")
    with pytest.raises(ValueError, match="branches must be one of 'current', 'all'"):
        hm.load(tmp_path, branches="latest")


def test_metric_columns_are_one_block_read_from_the_file(tmp_path):
    history(tmp_path)
    df = hm.load(tmp_path / "metrics" / "attempt-0001.h5")
    assert df.columns.tolist() == ["step", "attempt", "branch", "seq", "time", *COLS]
    assert df.dtypes.astype(str).tolist() == ["int64", "int32", "int64", "int64", "float64", "float64", "float64"]


def test_load_many_labels_rows_by_run(tmp_path):
    a, b = tmp_path / "exp-a", tmp_path / "exp-b"
    history(a)
    with MetricsWriter(b, ("reward/mean", "val/score"), attempt=0) as w:
        w.log(1, {"reward/mean": 0.5, "val/score": 0.25})
    df = hm.load_many([a, b])
    assert df.columns.tolist()[:2] == ["run", "step"] and "val/score" in df
    assert df.groupby("run").size().to_dict() == {"exp-a": 10, "exp-b": 1}
    assert df.loc[df["run"] == "exp-a", "val/score"].isna().all()
    assert df.attrs["damaged"] == {}
    same = hm.load_many([a, a / "metrics", b / "metrics" / "attempt-0000.h5"])
    assert same["run"].unique().tolist() == ["exp-a", "exp-a#2", "exp-b"]
    labelled = hm.load_many({"baseline": a}, columns=["reward/mean"])
    assert labelled["run"].unique().tolist() == ["baseline"] and labelled.columns[-1] == "reward/mean"
    with pytest.raises(TypeError):
        hm.load_many(str(a))


def test_events_merge_both_records_in_time_order(tmp_path):
    history(tmp_path)
    # the trainer's watchdog action as it writes it into events.jsonl (attempts numbered as the files)
    append_event(tmp_path, kind="watchdog.rollback", step=5, source="watchdog", attempt=0,
                 message="to step 2, and a longer story than the HDF5 one", checkpoint=2)
    append_event(tmp_path, kind="hang", step=7, source="monitor", attempt=0, message="no row for 60 s")
    append_event(tmp_path, kind="control.rollback", step=None, source="control", message="requested")
    ev = hm.events(tmp_path)
    assert ev.columns.tolist() == list(hm.eventlog.EVENT_FRAME_COLUMNS)
    by_kind = ev.set_index("kind")
    assert by_kind.loc["watchdog.rollback", "source"] == "both"
    assert by_kind.loc["watchdog.rollback", "message"] == "to step 2, and a longer story than the HDF5 one"
    assert by_kind.loc["watchdog.rollback", "details"] == {"checkpoint": 2}
    assert by_kind.loc["watchdog.rollback", "writer"] == "watchdog"
    assert by_kind.loc["resume", "source"] == "metrics" and by_kind.loc["resume", "writer"] is None
    assert by_kind.loc["hang", "source"] == "events.jsonl" and by_kind.loc["hang", "attempt"] == 0
    assert pd.isna(by_kind.loc["control.rollback", "step"]) and pd.isna(by_kind.loc["control.rollback", "attempt"])
    assert str(ev["step"].dtype) == "Int64" and ev["time"].is_monotonic_increasing
    assert len(ev) == 4


def test_events_of_a_file_read_its_runs_jsonl_and_unmatched_records_stay_apart(tmp_path):
    with MetricsWriter(tmp_path, COLS, attempt=0) as w:
        w.log_event(3, "paused", "on request")
    append_event(tmp_path, kind="paused", step=3, source="trainer", attempt=1, message="on request")  # other attempt
    ev = hm.events(tmp_path / "metrics" / "attempt-0000.h5")
    assert ev["source"].tolist() == ["metrics", "events.jsonl"]
    assert hm.events(tmp_path / "metrics")["source"].tolist() == ["metrics", "events.jsonl"]


def test_events_of_a_run_without_any(tmp_path):
    (tmp_path / "metrics").mkdir()
    ev = hm.events(tmp_path)
    assert len(ev) == 0 and ev.columns.tolist() == list(hm.eventlog.EVENT_FRAME_COLUMNS)


# ----------------------------------------------------------------------------- a live writer, then kill -9
WRITER = r"""
import sys
from hpcppo.metrics import MetricsWriter
w = MetricsWriter(sys.argv[1], ["reward/mean"], attempt=0, chunk_rows=4)
step = 0
while True:
    w.log(step, {"reward/mean": float(step)})
    if step == 20:
        for s in range(10, 25):  # a rollback to 9
            w.log(s, {"reward/mean": -float(s)})
        w.log_event(24, "watchdog.rollback", "to 9")
        step = 24
    if step % 7 == 0:
        w.log_event(step, "tick", str(step))
    step += 1
    print(step, flush=True)
"""


@pytest.mark.timeout(120, method="thread")
def test_views_and_events_of_a_live_writer_and_after_kill_9(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        while int(proc.stdout.readline()) < 40:
            pass
        for _ in range(5):  # while it writes
            every = hm.load(tmp_path, attempts="all", branches="all")
            on_current = every.loc[every["current"], "step"].tolist()
            assert on_current == list(range(len(on_current)))
            current = hm.load(tmp_path)["step"].tolist()  # read a moment later: as many rows or more
            assert current[:len(on_current)] == on_current and current == list(range(len(current)))
            assert (~every["current"]).sum() == 11  # old 10..20
            ev = hm.events(tmp_path)
            assert "watchdog.rollback" in set(ev["kind"]) and ev["time"].is_monotonic_increasing
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    every = hm.load(tmp_path, attempts="all", branches="all")
    steps = hm.load(tmp_path)["step"].to_numpy()
    np.testing.assert_array_equal(steps, np.arange(len(steps)))
    assert len(every) == len(steps) + 11 and every.attrs["damaged"] == {}
    assert hm.events(tmp_path)["kind"].value_counts()["watchdog.rollback"] == 1
    assert hm.events(tmp_path)["source"].unique().tolist() == ["metrics"]


def test_every_view_is_the_full_frame_filtered_whatever_the_columns(tmp_path):
    """Attempts that declare different columns, rollbacks in both: each view is a row subset of every row."""
    with MetricsWriter(tmp_path, ("a", "b"), attempt=0) as w:
        for s in [0, 1, 2, 3, 2, 3, 4, 5, 6]:
            w.log(s, {"a": s, "b": -s})
    with MetricsWriter(tmp_path, ("c", "a"), attempt=1) as w:
        for s in [4, 5, 6, 5, 6, 7]:
            w.log(s, {"a": 10 + s, "c": 100 + s})
    every = hm.load(tmp_path, attempts="all", branches="all")
    assert every.columns.tolist() == ["step", "attempt", "branch", "seq", "time", "a", "b", "c", "current"]
    for attempts in ("latest", "all"):
        for branches in ("current", "all"):
            view = hm.load(tmp_path, attempts=attempts, branches=branches)
            merged = every.merge(view[["attempt", "seq"]], on=["attempt", "seq"])
            pd.testing.assert_frame_equal(view.drop(columns="current", errors="ignore"),
                                          merged.drop(columns="current"), check_dtype=True)
    assert hm.load(tmp_path)["a"].tolist() == [0, 1, 2, 3, 14, 15, 16, 17]
    assert hm.load(tmp_path, columns=["c"])["c"].isna().tolist() == [True] * 4 + [False] * 4
