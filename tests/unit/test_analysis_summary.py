"""``hpcppo metrics summary``: the numbers (last, EMA, best, first non-finite value, events) and the table."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hpcppo.analysis.summary import ema_last, first_nonfinite, summarize_target
from hpcppo.analysis.targets import Target, resolve_target
from hpcppo.cli import main
from hpcppo.metrics import MetricsWriter
from hpcppo.rundir.events import append_event

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"
COLS = ("reward/mean", "kl/actor_ref", "kl/coef", "critic/vf_loss", "perf/step_time_s", "val/score",
        "time/checkpoint_s")


def compiled_run(runs: Path, *overrides: str) -> Path:
    """A run directory as `hpcppo compile` writes it (resolved.toml: 30 steps), without metrics."""
    before = set(runs.iterdir()) if runs.exists() else set()
    extra = [a for o in overrides for a in ("-o", o)]
    assert main(["compile", str(ARITH), "--site", "local", "--no-check-paths", "-q", "--runs-root", str(runs),
                 *extra]) == 0
    [new] = set(runs.iterdir()) - before
    return new


def story(run: Path) -> None:
    """Step 0 validation only; 1..8 with val every 4 and a checkpoint time every 3; vf_loss NaN at 6 -> rollback
    to 4; attempt 1 resumes at 8 and reaches 10."""
    def row(s, nan=False, bonus=0.0):
        r = {"reward/mean": 0.1 * s + bonus, "kl/actor_ref": 0.01 * s, "kl/coef": 0.001,
             "critic/vf_loss": math.nan if nan else 1.0 / s, "perf/step_time_s": 2.0 - 0.1 * s}
        if s % 4 == 0:
            r["val/score"] = 0.05 * s
        if s % 3 == 0:
            r["time/checkpoint_s"] = 0.5
        return r

    with MetricsWriter(run, COLS, attempt=0) as w:
        w.log(0, {"val/score": 0.0})
        for s in range(1, 7):
            w.log(s, row(s, nan=s == 6))
        w.log_event(6, "watchdog.rollback", "critic/vf_loss is NaN; back to step 4")
        for s in range(5, 10):
            w.log(s, row(s, bonus=0.01))
    with MetricsWriter(run, COLS, attempt=1) as w:
        w.log_event(8, "resume", "resumed from checkpoint step 7")
        for s in range(8, 11):
            w.log(s, row(s, bonus=0.02))
    append_event(run, kind="watchdog.rollback", step=6, source="watchdog", attempt=0,
                 message="critic/vf_loss is NaN; back to step 4", checkpoint=4)


def test_ema_is_bias_corrected_and_skips_nan():
    x = np.array([1.0, np.nan, 2.0, 3.0])
    w = 0.9
    num = sum(w ** (2 - i) * v for i, v in enumerate([1.0, 2.0, 3.0]))
    den = sum(w ** (2 - i) for i in range(3))
    assert ema_last(x, w) == pytest.approx(num / den)
    assert ema_last(np.array([5.0]), w) == 5.0
    assert math.isnan(ema_last(np.array([np.nan]), w))


def frame(values: dict[str, list[float]], current=None) -> pd.DataFrame:
    n = len(next(iter(values.values())))
    df = pd.DataFrame({"step": np.arange(n), "attempt": 0, "branch": 0, **values})
    df["current"] = np.ones(n, bool) if current is None else current
    return df


def test_first_nonfinite_tells_a_nan_value_from_a_metric_not_logged():
    nan, inf = math.nan, math.inf
    # step 0 logs only val (a validation row): not a NaN of loss; val every other step is sparse
    df = frame({"loss": [nan, 1, 2, nan, 4], "val/score": [0.5, nan, nan, nan, 0.6]})
    assert first_nonfinite(df, ["loss", "val/score"])["step"] == 3
    assert first_nonfinite(df, ["loss", "val/score"])["columns"] == ["loss"]
    # a custom metric never logged two rows in a row is sparse too; only inf counts there
    df = frame({"loss": [1, 2, 3, 4, 5, 6], "every2": [1, nan, 2, nan, inf, nan]})
    assert first_nonfinite(df, ["loss", "every2"])["step"] == 4
    assert first_nonfinite(frame({"loss": [1, 2, 3]}), ["loss"]) is None
    # a metric never logged (no critic) and NaN before its first value (warm-up) are not values
    assert first_nonfinite(frame({"loss": [1, 2, 3], "critic": [nan] * 3, "actor": [nan, 1, 2]}),
                           ["loss", "critic", "actor"]) is None
    # a rollback hides the NaN from the current history, not from this search
    bad = first_nonfinite(frame({"loss": [1, nan, 2]}, current=np.array([True, False, True])), ["loss"])
    assert bad == {"step": 1, "attempt": 0, "branch": 0, "current": False, "columns": ["loss"], "rows": 1}


def test_summary_of_a_run_with_a_rollback_and_a_resume(tmp_path):
    run = compiled_run(tmp_path / "runs")
    story(run)
    s = summarize_target(Target(run.name, run, run))
    assert (s["steps_done"], s["total_steps"], s["attempts"]) == (10, 30, [0, 1])
    assert s["rows"] == 11 and s["rows_left_behind"] == 2 + 2  # old 5, 6 (rollback); 8, 9 (redone by attempt 1)
    r = s["metrics"]["reward/mean"]
    assert r["last"] == pytest.approx(1.02) and r["best"] == pytest.approx(1.02) and r["best_step"] == 10
    assert s["metrics"]["perf/step_time_s"]["best_step"] == 10 and s["metrics"]["perf/step_time_s"]["goal"] == "min"
    assert s["metrics"]["kl/coef"]["best"] is None and s["metrics"]["kl/coef"]["min"] == 0.001
    assert s["metrics"]["val/score"]["last_step"] == 8
    assert s["first_nonfinite"] == {"step": 6, "attempt": 0, "branch": 0, "current": False,
                                    "columns": ["critic/vf_loss"], "rows": 1}
    assert s["events"]["counts"] == {"resume": 1, "watchdog.rollback": 1}
    assert [e["kind"] for e in s["events"]["last"]] == ["watchdog.rollback", "resume"]
    assert s["events"]["last"][0]["source"] == "both" and s["damaged"] == {}


def test_summary_command_table_and_json(tmp_path, capsys):
    runs = tmp_path / "runs"
    run = compiled_run(runs)
    story(run)
    assert main(["metrics", "summary", run.name, "--runs-root", str(runs)]) == 0
    out = capsys.readouterr().out
    assert f"{run.name}  10 of 30 steps (33%) | attempts 0, 1 | 11 rows (+4 left behind" in out
    assert "reward/mean" in out and "critic/vf_loss" in out and "time/checkpoint_s" not in out
    assert ("first non-finite value: step 6 (attempt 0, branch 0, on an abandoned branch): critic/vf_loss; "
            "1 row(s) with one") in out
    assert "events: 1 x resume, 1 x watchdog.rollback" in out
    assert main(["metrics", "summary", str(run), str(run / "metrics" / "attempt-0000.h5"), "--json",
                 "-m", "time/checkpoint_s"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["run"] for d in data] == [run.name, run.name]
    assert data[1]["attempts"] == [0] and "time/checkpoint_s" in data[0]["metrics"]


def test_non_finite_values_stay_strict_json(tmp_path, capsys):
    with MetricsWriter(tmp_path, ["reward/mean"], attempt=0) as w:
        w.log(1, {"reward/mean": 1.0})
        w.log(2, {"reward/mean": math.inf})
    assert main(["metrics", "summary", str(tmp_path), "--json"]) == 0
    [data] = json.loads(capsys.readouterr().out)
    assert data["metrics"]["reward/mean"]["last"] == "inf" and data["first_nonfinite"]["step"] == 2


def test_a_run_id_or_a_path(tmp_path):
    run = compiled_run(tmp_path / "runs")
    story(run)
    by_id = resolve_target(run.name, lambda: tmp_path / "runs")
    assert (by_id.name, by_id.path, by_id.run_dir) == (run.name, run, run)
    f = resolve_target(str(run / "metrics" / "attempt-0001.h5"), lambda: 1 / 0)  # no runs root needed
    assert (f.name, f.run_dir) == (run.name, run)
    m = resolve_target(str(run / "metrics"), lambda: 1 / 0)
    assert m.run_dir == run and m.resolved == run / "resolved.toml"


# ----------------------------------------------------------------------------- the log records which cells were logged
def _strip_logged(path: Path) -> None:
    """Make ``path`` a file as written before ``/logged`` existed (the dataset deleted, nothing else touched)."""
    import h5py

    with h5py.File(path, "a") as f:
        del f["logged"]


def _gaps_and_nans(run: Path, attempt: int = 0) -> None:
    """A dense loss that skips step 3 (not logged: no NaN) and a validation score that diverged (a real NaN) at a
    step where it is due, 4; the dense loss is a real NaN at 6."""
    with MetricsWriter(run, ("loss", "val/score"), attempt=attempt) as w:
        for s in range(1, 8):
            row = {} if s == 3 else {"loss": math.nan if s == 6 else 1.0 / s}
            if s % 2 == 0:
                row["val/score"] = math.nan if s == 4 else 0.5
            w.log(s, row)


def test_first_nonfinite_uses_the_logged_cells(tmp_path):
    """NaN meant both "not logged" and a real NaN: the summary guessed (a gap in a dense metric counted, a NaN of a
    sparse one did not). With /logged it knows: step 3 skipped the loss, step 4's validation score was NaN."""
    from hpcppo.metrics import load_with_logged

    _gaps_and_nans(tmp_path)
    every, logged = load_with_logged(tmp_path, attempts="all", branches="all")
    assert logged.dtype == np.int8 and logged.shape == (7, 2)
    assert logged[:, 0].tolist() == [1, 1, 0, 1, 1, 1, 1] and logged[:, 1].tolist() == [0, 1, 0, 1, 0, 1, 0]
    assert np.isnan(every["loss"].iloc[2]) and np.isnan(every["loss"].iloc[5])
    bad = first_nonfinite(every, ["loss", "val/score"], logged)
    assert (bad["step"], bad["columns"], bad["rows"]) == (4, ["val/score"], 2)  # step 4 (val), step 6 (loss)
    # the guess, as for a file without the record: it took the gap at 3 for a NaN and missed the NaN at 4
    guessed = first_nonfinite(every, ["loss", "val/score"])
    assert (guessed["step"], guessed["columns"]) == (3, ["loss"])


def test_files_without_the_record_still_read_and_keep_the_guess(tmp_path):
    from hpcppo.metrics import load, load_with_logged

    _gaps_and_nans(tmp_path)
    path = tmp_path / "metrics" / "attempt-0000.h5"
    _strip_logged(path)
    every, logged = load_with_logged(tmp_path, attempts="all", branches="all")
    assert (logged == -1).all() and logged.shape == (7, 2)
    assert every.equals(load(tmp_path, attempts="all", branches="all"))
    assert first_nonfinite(every, ["loss", "val/score"], logged)["step"] == 3  # the guess: nothing better is known
    # a run whose old attempt has no record and whose new one has: each attempt's rows judged by what it has
    _gaps_and_nans(tmp_path, attempt=1)
    every, logged = load_with_logged(tmp_path, attempts="all", branches="all")
    assert (logged[:7] == -1).all() and (logged[7:] >= 0).all()
    assert first_nonfinite(every, ["loss", "val/score"], logged)["rows"] == 1 + 2  # 3 (guess); 4 and 6 of attempt 1


def test_summary_command_reports_the_real_nan_not_the_gap(tmp_path, capsys):
    run = compiled_run(tmp_path / "runs")
    with MetricsWriter(run, COLS, attempt=0) as w:
        for s in range(1, 6):
            row = {"reward/mean": 0.1 * s, "kl/actor_ref": 0.01, "critic/vf_loss": 1.0}
            if s == 2:
                del row["critic/vf_loss"]  # not logged this step: not a non-finite value
            if s == 4:
                row["val/score"] = math.nan  # a validation that produced NaN
            w.log(s, row)
    s = summarize_target(Target(run.name, run, run))
    assert s["first_nonfinite"] == {"step": 4, "attempt": 0, "branch": 0, "current": True, "columns": ["val/score"],
                                    "rows": 1}
    assert main(["metrics", "summary", str(run)]) == 0
    assert "first non-finite value: step 4 (attempt 0, branch 0): val/score" in capsys.readouterr().out
