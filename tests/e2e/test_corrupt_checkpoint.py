"""A damaged checkpoint: resume falls back to the previous committed one (an event says which file and where it
went), the steps after it are redone exactly, and ``hpcppo export`` of the damaged step is one line. With every
checkpoint damaged the run fails in one line and moves nothing, instead of starting again at step 0."""

from __future__ import annotations

import os

import pytest

from hpcppo import metrics as hmetrics
from hpcppo.errors import RunStateError
from hpcppo.rundir import events as hevents
from hpcppo.rundir import checkpoints as layout

from _harness import compile_run, launch_ranks, logs_of, wait_all, write_spec

VOLATILE = ("time", "attempt", "branch", "seq")


def _numbers(df):
    keep = [c for c in df.columns if c not in VOLATILE and not c.startswith(("time/", "perf/"))]
    return df[keep].set_index("step").sort_index()


@pytest.mark.slow
def test_damaged_newest_checkpoint_falls_back_and_export_says_so(tmp_path, random_tiny, capsys):
    from hpcppo.cli import main

    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    run = compile_run(spec, tmp_path / "runs", ["trainer.total_steps=6", "checkpoint.save_every=2"])
    root = layout.checkpoints_root(run)
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    assert layout.list_committed(root) == [2, 4, 6]
    first = hmetrics.load(run)
    extra = root / "step-6" / "extra.pt"
    junk = os.urandom(extra.stat().st_size)
    extra.write_bytes(junk)

    # export: one line naming the file, no traceback, nothing written
    capsys.readouterr()
    out = tmp_path / "exported"
    code = main(["export", run.name, "--runs-root", str(run.parent), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == RunStateError.exit_code, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"checkpoint {extra} is damaged: crc32 " in err and "--step 4" in err, err
    assert not out.exists()

    # resume: falls back to step 4, sets step 6 aside, redoes steps 5 and 6 exactly
    assert wait_all(launch_ranks(run, 2, "a1")) == [0, 0], logs_of(run)
    assert "resumed from checkpoint step 4" in logs_of(run)
    df = hmetrics.load(run)
    assert list(df["step"]) == [1, 2, 3, 4, 5, 6]
    assert list(df["attempt"]) == [0, 0, 0, 0, 1, 1]
    assert _numbers(first).equals(_numbers(df)), (_numbers(first) - _numbers(df)).abs().max().sort_values().tail()
    (aside,) = layout.corrupt_dirs(root)
    assert aside.name.startswith("step-6.corrupt-") and (aside / "extra.pt").read_bytes() == junk  # kept whole
    assert layout.list_committed(root) == [2, 4, 6]  # step 6 saved again by the resumed attempt
    (event,) = hevents.read_events(run, kinds="checkpoint.corrupt")
    assert event["step"] == 6 and event["source"] == "trainer" and event["attempt"] == 1  # the second attempt, numbered as its metrics file
    assert event["file"] == str(extra) and event["fallback"] == 4 and event["set_aside_as"] == str(aside)
    assert "crc32" in event["message"] and "resuming from checkpoint step 4" in event["message"]
    logged = hmetrics.load_events(run)
    assert {"checkpoint.corrupt", "resume"} <= set(logged["kind"])

    # every checkpoint damaged: the job fails in one line, nothing is moved, no step is trained
    for step in layout.list_committed(root):
        (root / f"step-{step}" / "extra.pt").write_bytes(b"junk")
    before = sorted(p.name for p in root.iterdir())
    assert wait_all(launch_ranks(run, 2, "a2")) == [1, 1], logs_of(run)
    log0 = (run / "logs" / "rank-a2-0.log").read_text(errors="replace")
    assert f"hpcppo: error: no intact checkpoint to resume from in {root} (step 6: extra.pt: 4 bytes" in log0, log0
    assert "Traceback" not in log0, log0  # a diagnosed failure is one line, not a stack
    assert sorted(p.name for p in root.iterdir()) == before
    assert [e["step"] for e in hevents.read_events(run, kinds="checkpoint.corrupt")] == [6, 6, 4, 2]
    assert list(hmetrics.load(run)["step"]) == [1, 2, 3, 4, 5, 6]
