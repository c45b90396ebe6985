"""A writer in a real subprocess: a live reader sees rows grow, and a ``kill -9`` loses at most the row in flight."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from hpcppo.metrics import load, load_events

# The writer process. "stdin": log N rows per line read, answer "logged <total>". "loop": log rows as fast as
# possible, print "flushed <total>" after each log returned (so the row is flushed), until killed.
WRITER = r"""
import sys
from hpcppo.metrics import STANDARD_COLUMNS, MetricsWriter

run, mode, locking = sys.argv[1], sys.argv[2], {"none": None, "false": False}[sys.argv[3]]
w = MetricsWriter(run, STANDARD_COLUMNS, attempt=1, locking=locking)
step = 0
print("ready", flush=True)
if mode == "stdin":
    for line in sys.stdin:
        for _ in range(int(line)):
            w.log(step, {"reward/mean": float(step), "kl/actor_ref": step / 1000})
            step += 1
        w.log_event(step - 1, "batch", f"logged {step}")
        print("logged", step, flush=True)
    w.close()
    print("closed", flush=True)
else:
    while True:
        w.log(step, {"reward/mean": float(step), "kl/actor_ref": step / 1000})
        step += 1
        if step % 10 == 0:
            w.log_event(step - 1, "tick", str(step))
        print("flushed", step, flush=True)
"""


def _start(run, mode, locking="none", env=None):
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(run), mode, locking],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"writer did not start: {line!r} {proc.stderr.read()}")
    return proc


def _ask(proc, n):
    proc.stdin.write(f"{n}\n")
    proc.stdin.flush()
    return proc.stdout.readline().split()


def _assert_consistent(df):
    """Every row the reader returns is complete and in order: steps 0..n-1 with their own values."""
    n = len(df)
    assert df["step"].tolist() == list(range(n))
    assert df["seq"].tolist() == list(range(n))
    np.testing.assert_array_equal(df["reward/mean"].to_numpy(), np.arange(n, dtype=float))
    np.testing.assert_allclose(df["kl/actor_ref"].to_numpy(), np.arange(n) / 1000)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("locking", "env", "reader_locking"),
    [
        ("none", {}, None),
        ("false", {}, False),  # the NFS/Lustre site setting, passed as a parameter
        ("none", {"HDF5_USE_FILE_LOCKING": "FALSE"}, None),  # ... or as the environment variable
    ],
    ids=["default-locking", "locking-false", "env-locking-false"],
)
def test_live_reader_sees_rows_grow_while_the_writer_is_open(tmp_path, monkeypatch, locking, env, reader_locking):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    proc = _start(tmp_path, "stdin", locking, env)
    try:
        assert len(load(tmp_path, locking=reader_locking)) == 0  # the file exists, in SWMR mode, still empty
        seen = []
        for n in (3, 4, 1):
            assert _ask(proc, n)[0] == "logged"
            df = load(tmp_path, locking=reader_locking)
            _assert_consistent(df)
            seen.append(len(df))
            assert load_events(tmp_path, locking=reader_locking)["message"].iloc[-1] == f"logged {len(df)}"
        assert seen == [3, 7, 8]
        assert proc.poll() is None  # all of it read while the writer still had the file open
        proc.stdin.close()
        assert proc.stdout.readline().strip() == "closed"
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
    _assert_consistent(load(tmp_path, locking=reader_locking))


@pytest.mark.timeout(60)
def test_kill_minus_9_loses_at_most_the_row_in_flight(tmp_path):
    proc = _start(tmp_path, "loop")
    try:
        flushed = 0
        lengths = []
        # read concurrently with a writer that logs as fast as it can: every snapshot must be consistent
        while flushed < 300:
            line = proc.stdout.readline()
            assert line.startswith("flushed"), (line, proc.stderr.read() if not line else "")
            flushed = int(line.split()[1])
            if flushed % 60 == 0:
                df = load(tmp_path)
                _assert_consistent(df)
                assert len(df) >= flushed  # everything the writer reported flushed is visible
                lengths.append(len(df))
        assert lengths == sorted(lengths)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    # only whole lines count: a kill can land while print's words are reaching the pipe ("flushed" alone, or "flushed 12"
    # of "flushed 123", without its newline), and that row was not reported
    complete = rest.split("\n")[:-1]
    reported = [int(line.split()[1]) for line in complete if line.startswith("flushed")]
    last_reported = max([flushed, *reported])
    df = load(tmp_path)  # the file of a killed SWMR writer opens without repair
    _assert_consistent(df)
    assert last_reported <= len(df) <= last_reported + 1
    ev = load_events(tmp_path)
    assert ev["kind"].eq("tick").all() and len(ev) >= last_reported // 10
    assert ev["message"].tolist() == [str(10 * (i + 1)) for i in range(len(ev))]
