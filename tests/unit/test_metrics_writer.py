"""MetricsWriter on real HDF5 files: schema, validation, events, attempts, I/O failure recovery, fsync."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from hpcppo.errors import HpcppoError, RunStateError
from hpcppo.metrics import STANDARD_COLUMNS, MetricsWriter, UnknownColumnError, load, load_events
from hpcppo.metrics import writer as writer_mod

COLS = ("reward/mean", "kl/actor_ref", "actor/pg_loss")


def test_standard_columns_cover_the_design_contract():
    for name in ("reward/mean", "reward/std", "score/mean", "kl/actor_ref", "kl/coef", "actor/pg_clipfrac_lower",
                 "actor/ppo_kl", "critic/vf_explained_var", "perf/tokens_per_s", "time/weight_sync_s",
                 "rollout/logprob_gap", "val/score"):
        assert name in STANDARD_COLUMNS
    assert len(set(STANDARD_COLUMNS)) == len(STANDARD_COLUMNS)


def test_round_trip_values_names_and_structural_columns(tmp_path):
    t0 = time.time()
    with MetricsWriter(tmp_path, STANDARD_COLUMNS, attempt=1) as w:
        assert w.path == tmp_path / "metrics" / "attempt-0001.h5"
        for step in range(4):
            w.log(step, {"reward/mean": 0.5 * step, "actor/pg_loss": -step, "kl/actor_ref": np.float32(0.25)})
        assert w.rows_written == 4 and w.rows_pending == 0
    df = load(tmp_path)
    assert list(df.columns[:5]) == ["step", "attempt", "branch", "seq", "time"]
    assert list(df.columns[5:]) == list(STANDARD_COLUMNS)
    assert df["step"].tolist() == [0, 1, 2, 3]
    assert df["seq"].tolist() == [0, 1, 2, 3]
    assert set(df["attempt"]) == {1} and set(df["branch"]) == {0}
    assert df["reward/mean"].tolist() == [0.0, 0.5, 1.0, 1.5]
    assert df["actor/pg_loss"].tolist() == [0.0, -1.0, -2.0, -3.0]
    assert df["kl/actor_ref"].tolist() == [0.25] * 4
    assert ((df["time"] >= t0) & (df["time"] <= time.time())).all()
    assert df["time"].is_monotonic_increasing
    # omitted columns are NaN, not 0
    assert df["critic/vf_loss"].isna().all()


def test_file_layout_keeps_original_names_in_an_attribute(tmp_path):
    with MetricsWriter(tmp_path / "m.h5", COLS, attempt=0) as w:
        w.log(0, {"kl/actor_ref": 1.0})
    with h5py.File(tmp_path / "m.h5", "r") as f:
        assert [c.decode() for c in f.attrs["columns"]] == list(COLS)
        assert f["values"].shape == (1, 3)
        assert f["step"].dtype == np.int64 and f["attempt"].dtype == np.int32
        assert f["branch"].dtype == np.int64 and f["seq"].dtype == np.int64 and f["time"].dtype == np.float64
        assert f["values"].maxshape == (None, 3) and f["values"].chunks is not None
        assert f.attrs["format"] == "hpcppo.metrics"


def test_unknown_column_is_rejected_with_close_matches_and_writes_nothing(tmp_path):
    with MetricsWriter(tmp_path, STANDARD_COLUMNS, attempt=1) as w:
        w.log(0, {"reward/mean": 1.0})
        with pytest.raises(UnknownColumnError) as err:
            w.log(1, {"reward/mean": 2.0, "actor/pg_clipfrc": 0.1})
        assert isinstance(err.value, HpcppoError) and isinstance(err.value, ValueError)
        msg = str(err.value)
        assert "'actor/pg_clipfrc'" in msg and "did you mean" in msg and "'actor/pg_clipfrac'" in msg
        assert "attempt-0001.h5" in msg
        assert "actor/pg_clipfrac" in err.value.close_matches
        with pytest.raises(UnknownColumnError, match="'zzz'"):
            w.log(1, {"zzz": 1.0})
        assert w.rows_written == 1
        # a rejected row does not count as a logged step: logging step 1 now is not a rollback
        w.log(1, {"reward/mean": 2.0})
        assert w.branch == 0
    assert load(tmp_path)["reward/mean"].tolist() == [1.0, 2.0]


def test_non_numeric_value_and_bad_steps_are_rejected(tmp_path):
    with MetricsWriter(tmp_path, COLS, attempt=1) as w:
        with pytest.raises(TypeError, match="'reward/mean'"):
            w.log(0, {"reward/mean": "high"})
        with pytest.raises(ValueError, match="step must be >= 0"):
            w.log(-1, {})
        with pytest.raises(TypeError):
            w.log(1.5, {})  # type: ignore[arg-type]
        w.log(np.int64(3), {"reward/mean": math.inf})
    assert load(tmp_path)["reward/mean"].tolist() == [math.inf]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ((), "at least one"),
        (("a", "a"), "declared twice"),
        (("step",), "reserved"),
        (("superseded",), "reserved"),
        (("",), "non-empty"),
        ((" a",), "non-empty"),
        ("reward/mean", "not a single string"),
    ],
)
def test_bad_column_declarations(tmp_path, columns, message):
    with pytest.raises(ValueError, match=message):
        MetricsWriter(tmp_path, columns, attempt=1)
    assert not (tmp_path / "metrics").exists() or not any((tmp_path / "metrics").iterdir())


def test_an_attempt_file_is_never_reopened_or_overwritten(tmp_path):
    with MetricsWriter(tmp_path, COLS, attempt=1) as w:
        w.log(0, {"reward/mean": 1.0})
    before = (tmp_path / "metrics" / "attempt-0001.h5").read_bytes()
    with pytest.raises(RunStateError, match="attempt 1 already exists"):
        MetricsWriter(tmp_path, COLS, attempt=1)
    assert (tmp_path / "metrics" / "attempt-0001.h5").read_bytes() == before
    # no temporary file is left behind either
    assert sorted(p.name for p in (tmp_path / "metrics").iterdir()) == ["attempt-0001.h5"]


def test_no_clobber_publish_refuses_a_file_that_appeared_meanwhile(tmp_path, monkeypatch):
    """Another writer creating the same attempt between the existence check and the publish loses nothing."""
    final = tmp_path / "metrics" / "attempt-0002.h5"
    real_create = h5py.File

    def create_and_race(*args, **kwargs):
        final.parent.mkdir(parents=True, exist_ok=True)
        final.write_bytes(b"the other writer's file")
        return real_create(*args, **kwargs)

    monkeypatch.setattr(writer_mod.h5py, "File", create_and_race)
    with pytest.raises(RunStateError, match="created by another writer"):
        MetricsWriter(tmp_path, COLS, attempt=2)
    assert final.read_bytes() == b"the other writer's file"
    assert sorted(p.name for p in final.parent.iterdir()) == ["attempt-0002.h5"]


def test_events_round_trip_and_validation(tmp_path):
    with MetricsWriter(tmp_path, COLS, attempt=3) as w:
        w.log(0, {"reward/mean": 1.0})
        w.log_event(0, "kl_coef.raised", "kl 0.07 > 0.05: kl_coef 0.001 -> 0.0015")
        w.log_event(5, "rollback", "é" * 2000)
        with pytest.raises(ValueError, match="event kind 'Roll Back'"):
            w.log_event(5, "Roll Back", "x")
        with pytest.raises(TypeError):
            w.log_event(5, "pause", 3)  # type: ignore[arg-type]
    ev = load_events(tmp_path)
    assert ev.columns.tolist() == ["attempt", "step", "time", "kind", "message"]
    assert ev["kind"].tolist() == ["kl_coef.raised", "rollback"]
    assert ev["step"].tolist() == [0, 5] and set(ev["attempt"]) == {3}
    assert ev["message"][0] == "kl 0.07 > 0.05: kl_coef 0.001 -> 0.0015"
    long = ev["message"][1]
    assert long.endswith("\u2026") and set(long[:-1]) == {"é"} and len(long.encode()) <= 1024


def test_flush_failure_keeps_rows_and_recovers(tmp_path, monkeypatch, caplog):
    w = MetricsWriter(tmp_path, COLS, attempt=1)
    w.log(0, {"reward/mean": 0.0})
    real_flush = w._file.flush
    calls = {"n": 0}

    def flaky_flush():
        calls["n"] += 1
        if calls["n"] <= 2:
            raise OSError(5, "Input/output error")
        real_flush()

    monkeypatch.setattr(w._file, "flush", flaky_flush)
    with caplog.at_level(logging.WARNING, logger="hpcppo.metrics.writer"):
        w.log(1, {"reward/mean": 1.0})  # must not raise
        w.log_event(1, "pause", "during an outage")
        assert w.rows_pending == 1 and w.rows_written == 1
        assert "writing metrics failed" in caplog.text and "Input/output error" in caplog.text
        w.log(2, {"reward/mean": 2.0})  # third flush succeeds: everything pending is written
        assert w.rows_pending == 0 and w.rows_written == 3
        assert "recovered after 2 failed tries" in caplog.text
    w.close()
    df = load(tmp_path)
    assert df["step"].tolist() == [0, 1, 2] and df["reward/mean"].tolist() == [0.0, 1.0, 2.0]
    assert df["seq"].tolist() == [0, 1, 2]
    assert load_events(tmp_path)["message"].tolist() == ["during an outage"]


def test_failure_halfway_through_an_append_is_rewritten_on_retry(tmp_path, monkeypatch, caplog):
    """Some datasets resized, others not: the retry rewrites the same slice, so nothing is doubled."""
    w = MetricsWriter(tmp_path, COLS, attempt=1)
    w.log(0, {"reward/mean": 0.0})
    values = w._ds["values"]
    real_resize = values.resize
    state = {"fail": True}

    def resize_once_failing(*args, **kwargs):
        if state["fail"]:
            state["fail"] = False
            raise OSError("Can't extend dataset")
        return real_resize(*args, **kwargs)

    monkeypatch.setattr(values, "resize", resize_once_failing)
    with caplog.at_level(logging.WARNING, logger="hpcppo.metrics.writer"):
        w.log(1, {"reward/mean": 1.0})
    assert w._ds["step"].shape[0] == 2 and values.shape[0] == 1  # lengths differ after the failure
    w.log(2, {"reward/mean": 2.0})
    assert all(d.shape[0] == 3 for d in w._ds.values())
    w.close()
    df = load(tmp_path)
    assert df["step"].tolist() == [0, 1, 2] and df["reward/mean"].tolist() == [0.0, 1.0, 2.0]


def test_fsync_syncs_hdf5s_own_descriptor(tmp_path, monkeypatch, caplog):
    w = MetricsWriter(tmp_path, COLS, attempt=1)
    w.log(0, {"reward/mean": 1.0})
    synced = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(writer_mod.os, "fsync", spy)
    assert w.fsync() is True
    assert synced == [os.stat(w.path).st_ino]

    def broken(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(writer_mod.os, "fsync", broken)
    with caplog.at_level(logging.WARNING, logger="hpcppo.metrics.writer"):
        assert w.fsync() is False
    assert "fsync of the metric log failed" in caplog.text
    monkeypatch.setattr(writer_mod.os, "fsync", real_fsync)
    w.close()
    w.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        w.log(1, {})


def test_locking_false_reaches_hdf5(tmp_path):
    with MetricsWriter(tmp_path, COLS, attempt=1, locking=False) as w:
        assert w._file.id.get_access_plist().get_file_locking()[0] == 0
        w.log(0, {"reward/mean": 1.0})
    # the reader must use the same setting as any handle this process still has; here none is open
    assert load(tmp_path, locking=False)["reward/mean"].tolist() == [1.0]


def test_without_swmr_the_file_is_readable_after_close(tmp_path):
    with MetricsWriter(tmp_path, COLS, attempt=1, swmr=False) as w:
        w.log(0, {"reward/mean": 1.0})
        w.log(1, {"reward/mean": 2.0})
    assert load(tmp_path)["reward/mean"].tolist() == [1.0, 2.0]


@pytest.mark.parametrize(("env", "expected"), [("FALSE", 0), ("0", 0), ("TRUE", 1)])
def test_hdf5_use_file_locking_is_honoured_even_when_set_after_import(tmp_path, monkeypatch, env, expected):
    monkeypatch.setenv("HDF5_USE_FILE_LOCKING", env)
    with MetricsWriter(tmp_path, COLS, attempt=1) as w:
        assert w._file.id.get_access_plist().get_file_locking()[0] == expected
        w.log(0, {"reward/mean": 1.0})
    assert load(tmp_path)["reward/mean"].tolist() == [1.0]


def test_the_package_does_not_import_torch():
    """The login-node CLI reads metrics: importing the package must not pull torch in."""
    code = "import sys, hpcppo.metrics; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
