"""docs/metrics.md is the contract of the metric log: its h5py-only reader (run verbatim, in an interpreter that
never imports hpcppo or pandas) reads a log written by the real writer -- two attempts, a rollback, events,
one file still open for writing -- exactly as ``hpcppo.metrics.load`` does; the tables match the schema
module; the system's ``h5ls``/``h5dump`` read a closed file, and a copy of a live one as the page says."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hpcppo.metrics as hm
from hpcppo.metrics import STANDARD_COLUMNS, MetricsWriter, schema

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "metrics.md"
EXTRA = ("actor/kl_loss", "val/score/arith")


def doc_reader() -> str:
    text = DOC.read_text()
    m = re.search(r"<!-- doc-test: read-log -->\n```python\n(.*?)```", text, re.S)
    assert m, "docs/metrics.md lost its marked reader"
    return m.group(1)


def write_run(run: Path) -> MetricsWriter:
    """A run as the trainer writes it; returns the writer of attempt 1, still open."""
    with MetricsWriter(run, (*STANDARD_COLUMNS, *EXTRA), attempt=0) as w:
        w.log(0, {"val/score": 0.5, "val/score/arith": 0.5})
        for s in range(1, 9):
            w.log(s, {c: s + j / 100 for j, c in enumerate(STANDARD_COLUMNS)})
        w.log_event(8, "watchdog.rollback", "kl/actor_ref=0.9 > 0.6; back to step 5")
        for s in range(6, 12):
            w.log(s, {"reward/mean": 10.0 + s, "kl/coef": 0.002})
        w.log_event(11, "preempted", "USR2")
    live = MetricsWriter(run, ("reward/mean", "kl/coef", "val/score"), attempt=1)  # other columns
    live.log_event(10, "resume", "resumed from checkpoint step 10")
    for s in range(11, 15):
        live.log(s, {"reward/mean": 100.0 + s, "kl/coef": 0.003})
    return live


READ = """
import json, sys
{reader}
run = sys.argv[1]
rows = read_run(run)
events = [e for p in sorted(glob.glob(os.path.join(run, "metrics", "attempt-*.h5"))) for e in read_events(p)]
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("hpcppo", "pandas", "torch"))
print(json.dumps({{"rows": {{k: [None if x != x else x for x in v.tolist()] for k, v in rows.items()}},
                  "events": events, "heavy": heavy}}))
"""


@pytest.fixture()
def run(tmp_path):
    writer = write_run(tmp_path)
    yield tmp_path
    writer.close()


def test_the_documented_reader_reads_what_load_reads(run):
    proc = subprocess.run([sys.executable, "-c", READ.format(reader=doc_reader()), str(run)], capture_output=True,
                          text=True, timeout=120, cwd=run)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["heavy"] == []
    rows = {k: np.array([np.nan if x is None else x for x in v]) for k, v in out["rows"].items()}
    every = hm.load(run, attempts="all", branches="all")
    assert rows["current"].astype(bool).tolist() == every["current"].tolist()
    for name in every.columns:
        np.testing.assert_array_equal(rows[name], every[name].to_numpy(dtype=float), err_msg=name)
    assert set(rows) == set(every.columns)
    cur = rows["current"].astype(bool)
    np.testing.assert_array_equal(rows["step"][cur], hm.load(run)["step"].to_numpy())
    assert [e[2] for e in out["events"]] == ["watchdog.rollback", "preempted", "resume"]
    assert [e[2] for e in out["events"]] == hm.load_events(run)["kind"].tolist()


def test_the_documented_tables_match_the_schema(run):
    text = DOC.read_text()
    for name, (dtype, fill) in schema.STRUCTURAL.items():
        fill_text = "NaN" if fill != fill else str(fill)
        assert re.search(rf"\| `/{name}` \| `\(N,\)` \| {np.dtype(dtype).name} \| {re.escape(fill_text)} \|", text), name
    assert f"`\"{schema.FORMAT}\"`" in text and f"`{schema.FORMAT_VERSION}`" in text
    assert f"{schema.KIND_BYTES} bytes" in text and f"{schema.MESSAGE_BYTES} bytes" in text
    assert f"strings of {schema.COLUMN_NAME_BYTES} bytes" in text
    import h5py

    path = run / "metrics" / "attempt-0000.h5"
    with h5py.File(path, "r", swmr=True) as f:
        assert sorted(f.attrs) == ["attempt", "columns", "created_unix", "format", "format_version", "job_attempt"]
        for attr in f.attrs:
            assert f"| `{attr}` |" in text
        assert sorted(f) == ["attempt", "branch", "events", "logged", "seq", "step", "time", "values"]
        assert f["logged"].dtype == np.uint8 and f["logged"].fillvalue == 0 and f["logged"].shape == f["values"].shape
        assert "| `/logged` | `(N, C)` | uint8 | 0 |" in text
        assert sorted(f["events"]) == ["kind", "message", "step", "time"]
        assert f["values"].shape[1] == len(f.attrs["columns"]) == len(STANDARD_COLUMNS) + len(EXTRA)


@pytest.mark.skipif(not all(shutil.which(t) for t in ("h5dump", "h5ls", "h5clear")), reason="hdf5-tools missing")
def test_h5ls_and_h5dump_read_the_files_closed_and_live(run):
    closed, live = run / "metrics" / "attempt-0000.h5", run / "metrics" / "attempt-0001.h5"
    listing = subprocess.run(["h5ls", "-r", str(closed)], capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    n_cols = len(STANDARD_COLUMNS) + len(EXTRA)
    assert re.search(rf"/values\s+Dataset \{{15/Inf, {n_cols}\}}", listing.stdout), listing.stdout
    assert re.search(r"/events/kind\s+Dataset \{2/Inf\}", listing.stdout), listing.stdout
    header = subprocess.run(["h5dump", "-H", str(closed)], capture_output=True, text=True, timeout=60)
    assert header.returncode == 0 and 'ATTRIBUTE "columns"' in header.stdout and "H5T_CSET_UTF8" in header.stdout
    # a file its writer still holds (or a killed writer's): as docs/metrics.md says, a copy with its mark cleared
    copy = run / "copy.h5"
    shutil.copy(live, copy)
    assert subprocess.run(["h5clear", "-s", str(copy)], capture_output=True, timeout=60).returncode == 0
    row = subprocess.run(["h5dump", "-d", "/values", "-s", "3,0", "-c", "1,2", str(copy)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert row.returncode == 0, row.stderr
    assert re.search(r"\(3,0\): 114, 0\.003", row.stdout), row.stdout
    names = subprocess.run(["h5dump", "-a", "/columns", str(copy)], capture_output=True, text=True, timeout=60)
    assert names.returncode == 0 and '"reward/mean' in names.stdout and '"val/score' in names.stdout
    events = subprocess.run(["h5dump", "-d", "/events/message", str(copy)], capture_output=True, text=True, timeout=60)
    assert events.returncode == 0 and "resumed from checkpoint step 10" in events.stdout
    assert len(hm.load(live)) == 4  # the original, untouched, still read in SWMR mode
