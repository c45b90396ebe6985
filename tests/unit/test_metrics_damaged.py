"""A truncated metric log is read within seconds: the rows that are provably intact, marked as damaged, through
``load``, ``load_events`` and the CLI -- never a hang (HDF5's SWMR metadata retries are bounded:
hpcppo.metrics.h5io) and never the zeros HDF5 reads past the end of a file taken for data."""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hpcppo.cli import main
from hpcppo.errors import PathError
from hpcppo.metrics import STANDARD_COLUMNS, MetricsWriter, h5io, load, load_events

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"
ROWS = 50
FRACTIONS = [0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95]
# A hang is a failure, not a stuck test run: the thread method ends the process even inside HDF5's sleep loop.
no_hang = pytest.mark.timeout(120, method="thread")


def write_log(run: Path, *, chunk_rows: int, attempt: int = 1) -> Path:
    """ROWS rows of every standard column (distinct values) and an event every 5 steps."""
    with MetricsWriter(run, STANDARD_COLUMNS, attempt=attempt, chunk_rows=chunk_rows) as w:
        for step in range(ROWS):
            w.log(step, {c: step + j / 100 for j, c in enumerate(STANDARD_COLUMNS)})
            if step % 5 == 0:
                w.log_event(step, "note", f"step {step}")
    return w.path


def truncated_copy(source: Path, run: Path, fraction: float) -> Path:
    target = run / "metrics" / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, target)
    os.truncate(target, int(source.stat().st_size * fraction))
    return target


def timed(fn, *args):
    t0 = time.monotonic()
    out = fn(*args)
    return out, time.monotonic() - t0


def assert_prefix(got: pd.DataFrame, whole: pd.DataFrame) -> None:
    """``got`` is the first rows of ``whole``, value for value (no zero read past the end taken for data)."""
    assert len(got) <= len(whole)
    for column in got.columns:
        np.testing.assert_array_equal(got[column].to_numpy(), whole[column].to_numpy()[: len(got)], err_msg=column)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """The writer's default chunks (one chunk holds all 50 rows) and small ones (a chunk per 4 rows)."""
    root = tmp_path_factory.mktemp("sources")
    return {"default-chunks": write_log(root / "a", chunk_rows=64), "small-chunks": write_log(root / "b", chunk_rows=4)}


@no_hang
@pytest.mark.parametrize("chunks", ["default-chunks", "small-chunks"])
@pytest.mark.parametrize("fraction", FRACTIONS)
def test_a_truncated_file_gives_its_intact_rows_marked_as_damaged(sources, tmp_path, caplog, chunks, fraction):
    source = sources[chunks]
    whole, whole_events = load(source), load_events(source)
    assert len(whole) == ROWS and len(whole_events) == ROWS // 5 and whole.attrs["damaged"] == {}
    target = truncated_copy(source, tmp_path, fraction)

    with caplog.at_level(logging.WARNING, logger="hpcppo.metrics.reader"):
        df, seconds = timed(load, tmp_path)
    assert seconds < 60.0  # a hang, not slowness: the machine may be busy
    assert_prefix(df, whole)
    if len(df) < ROWS:
        assert list(df.attrs["damaged"]) == [str(target)]
        what = df.attrs["damaged"][str(target)]
        assert "rows kept" in what or "no row can be read" in what
        [record] = caplog.records
        assert str(target) in record.getMessage() and "damaged metric log" in record.getMessage()
        assert "\n" not in record.getMessage()
    else:
        assert df.attrs["damaged"] == {}  # the rows' bytes are all there (what was cut held no row)

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hpcppo.metrics.reader"):
        events, seconds = timed(load_events, tmp_path)
    assert seconds < 60.0  # a hang, not slowness: the machine may be busy
    assert_prefix(events, whole_events)
    assert (len(events) < len(whole_events)) == bool(events.attrs["damaged"]) == bool(caplog.records)


def test_small_chunks_keep_a_partial_prefix(sources, tmp_path):
    """With a chunk per 4 rows a cut in the middle keeps the rows before it (not all or nothing)."""
    kept = []
    for fraction in FRACTIONS:
        run = tmp_path / str(fraction)
        truncated_copy(sources["small-chunks"], run, fraction)
        kept.append(len(load(run)))
    assert kept == sorted(kept) and any(0 < k < ROWS for k in kept), kept


@no_hang
def test_the_issue_reproduction_truncate_to_38000_bytes(sources, tmp_path):
    """`truncate -s 38000 runs/<id>/metrics/attempt-0001.h5` then load: used to block forever."""
    target = truncated_copy(sources["default-chunks"], tmp_path, 1.0)
    os.truncate(target, 38000)
    df, seconds = timed(load, tmp_path)
    assert seconds < 60.0  # a hang, not slowness: the machine may be busy
    assert df.attrs["damaged"] == {
        str(target): f"0 of its {ROWS} rows kept, the others are lost (truncated: 38000 of its "
                     f"{sources['default-chunks'].stat().st_size} bytes are left)"}  # fmt: skip


def test_other_attempts_are_read_beside_a_damaged_one(sources, tmp_path):
    truncated_copy(sources["default-chunks"], tmp_path, 1.0)  # attempt 1, whole
    damaged = write_log(tmp_path, chunk_rows=64, attempt=2)
    os.truncate(damaged, 38000)
    df = load(tmp_path)
    assert df["attempt"].tolist() == [1] * ROWS and list(df.attrs["damaged"]) == [str(damaged)]


def test_a_file_cut_inside_its_superblock_is_a_path_error(sources, tmp_path):
    """Too short to tell a truncated metric log from any other file: a one-line error naming it."""
    target = truncated_copy(sources["default-chunks"], tmp_path, 1.0)
    os.truncate(target, 30)
    with pytest.raises(PathError, match="cannot open the metric log") as info:
        load(tmp_path)
    assert str(target) in str(info.value) and "\n" not in str(info.value)


def test_truncation_reads_the_size_the_superblock_records(sources, tmp_path):
    source = sources["default-chunks"]
    size = source.stat().st_size
    assert h5io.stored_size(source) == size and h5io.truncation(source) is None
    target = truncated_copy(source, tmp_path, 0.5)
    assert h5io.truncation(target) == f"{size // 2} of its {size} bytes are left"
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5")
    assert h5io.stored_size(junk) is None and h5io.truncation(junk) is None


def test_the_file_access_list_bounds_the_metadata_read_attempts():
    """HDF5's SWMR default is 100 tries with a sleep doubling from 1 ns (~2^100 ns on a missing block)."""
    lib = h5io._hdf5_library()
    assert lib is not None
    fn = lib.H5Pget_metadata_read_attempts
    fn.argtypes, fn.restype = [ctypes.c_int64, ctypes.POINTER(ctypes.c_uint)], ctypes.c_int
    attempts = ctypes.c_uint()
    assert fn(h5io.file_access(None).id, ctypes.byref(attempts)) >= 0
    assert attempts.value == h5io.METADATA_READ_ATTEMPTS == 24


# ----------------------------------------------------------------------------- a live writer is not damage
WRITER = r"""
import sys
from hpcppo.metrics import STANDARD_COLUMNS, MetricsWriter
w = MetricsWriter(sys.argv[1], STANDARD_COLUMNS, attempt=1, chunk_rows=4)
step = 0
while True:
    w.log(step, {"reward/mean": float(step)})
    if step % 3 == 0:
        w.log_event(step, "tick", str(step))
    step += 1
    if step == 1:
        print("ready", flush=True)
"""


@pytest.mark.timeout(120, method="thread")
def test_reads_while_a_writer_appends_are_never_marked_damaged(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        lengths = []
        for _ in range(40):
            df, events = load(tmp_path), load_events(tmp_path)
            assert df.attrs["damaged"] == {} and events.attrs["damaged"] == {}
            assert df["step"].tolist() == list(range(len(df)))
            assert df["reward/mean"].tolist() == [float(s) for s in range(len(df))]
            assert events["step"].tolist() == list(range(0, 3 * len(events), 3))
            lengths.append(len(df))
        assert lengths == sorted(lengths) and lengths[-1] > lengths[0]
    finally:
        proc.kill()
        proc.wait()


# ----------------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("runs")
    assert main(["compile", str(ARITH), "--site", "local", "--no-check-paths", "-q", "--runs-root", str(runs)]) == 0
    [run] = runs.iterdir()
    return run


def hpcppo(*argv: str) -> subprocess.CompletedProcess:
    """The real command line in a fresh interpreter (no test logging handlers: what a user sees)."""
    return subprocess.run([sys.executable, "-m", "hpcppo.cli", *argv], capture_output=True, text=True, timeout=60,
                          cwd=REPO)  # fmt: skip


@pytest.mark.parametrize("fraction", [0.05, 0.35, 0.65, 0.95])
def test_watchdog_replay_of_a_truncated_log_warns_in_one_line(sources, run_dir, fraction):
    metrics = run_dir / "metrics"
    shutil.rmtree(metrics, ignore_errors=True)
    target = truncated_copy(sources["default-chunks"], run_dir, fraction)
    kept = len(load(run_dir))
    t0 = time.monotonic()
    proc = hpcppo("watchdog", "replay", run_dir.name, "--runs-root", str(run_dir.parent))
    assert time.monotonic() - t0 < 60.0  # a fresh interpreter's imports included
    assert "Traceback" not in proc.stderr + proc.stdout
    assert f"over {kept} logged steps" in proc.stdout
    lines = proc.stderr.strip().splitlines()
    if kept < ROWS:  # the same line and exit code as every other reader of the log (metrics summary, export ...)
        assert proc.returncode == 5, proc.stderr
        assert len(lines) == 1 and lines[0].startswith(f"hpcppo: error: {target}: damaged metric log: "), proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert lines == [], proc.stderr


def test_status_does_not_read_the_metric_log(sources, run_dir):
    shutil.rmtree(run_dir / "metrics", ignore_errors=True)
    truncated_copy(sources["default-chunks"], run_dir, 0.5)
    proc = hpcppo("status", run_dir.name, "--runs-root", str(run_dir.parent))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert run_dir.name in proc.stdout
