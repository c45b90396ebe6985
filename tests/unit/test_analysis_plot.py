"""``hpcppo plot``: smoothing, the rows and marks drawn, the image files, and every bad input as one line."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from hpcppo.analysis import plot
from hpcppo.analysis.targets import Target
from hpcppo.cli import main
from hpcppo.errors import ConfigError
from hpcppo.metrics import STANDARD_COLUMNS, MetricsWriter
from hpcppo.rundir.events import append_event


def write_run(run, *, rollback_at: int | None = 12, back_to: int = 10, steps: int = 20, attempt: int = 0):
    """A run directory's metric log: steps 1..``steps``; at ``rollback_at`` a rollback to ``back_to`` (the steps
    after it logged again on a new branch), with its events in the HDF5 log and in events.jsonl."""
    with MetricsWriter(run, STANDARD_COLUMNS, attempt=attempt, swmr=False) as w:
        step = 1
        rolled = False
        while step <= steps:
            w.log(step, {"reward/mean": step / steps + (0.1 if rolled else 0.0), "kl/actor_ref": 0.01 * step,
                         "kl/coef": 0.001, "perf/tokens_per_s": 100.0, "perf/step_time_s": 2.0,
                         **({"val/score": 0.5} if step % 5 == 0 else {})})
            if step == rollback_at and not rolled:
                w.log_event(step, "watchdog.rollback", f"back to checkpoint step {back_to}")
                append_event(run, kind="watchdog.rollback", step=step, source="watchdog",
                             message=f"back to checkpoint step {back_to}", attempt=attempt + 1)
                rolled = True
                step = back_to + 1
                continue
            step += 1
        w.log_event(steps, "paused", "stopping at a step boundary")
    return run


def target(name, path):
    return Target(name, path, path)


@pytest.fixture()
def run(tmp_path):
    (tmp_path / "r1" / "metrics").mkdir(parents=True)
    return write_run(tmp_path / "r1")


# ----------------------------------------------------------------------------- pure parts
def test_smoothing_specs():
    assert plot.parse_smooth(None) == plot.parse_smooth("none") == plot.Smoothing("none")
    assert plot.parse_smooth("ema:0.9") == plot.Smoothing("ema", 0.9)
    assert plot.parse_smooth("window:5") == plot.Smoothing("window", 5)
    for bad in ("ema:1", "ema:-0.1", "ema:x", "window:0", "window:2.5", "gauss:3"):
        with pytest.raises(ConfigError, match="--smooth"):
            plot.parse_smooth(bad)


def test_ema_is_bias_corrected_and_window_is_trailing():
    y = np.array([1.0, 1.0, 1.0, 4.0])
    ema = plot.Smoothing("ema", 0.5).apply(y)
    assert ema[:3] == pytest.approx([1.0, 1.0, 1.0])  # not pulled towards 0 at the start
    assert ema[3] == pytest.approx((0.5 * 0.875 + 0.5 * 4.0) / (1 - 0.5 ** 4))
    assert plot.Smoothing("window", 2).apply(y) == pytest.approx([1.0, 1.0, 1.0, 2.5])
    assert plot.Smoothing("none").apply(y) is y


def test_metric_lists():
    assert plot.parse_metrics(None) == list(plot.DEFAULT_METRICS)
    assert plot.parse_metrics(["a,b", "c", "a"]) == ["a", "b", "c"]


def test_rows_marks_and_the_fork_of_an_abandoned_branch(run):
    [s] = plot.load_series([target("r1", run)], ["reward/mean"], "step")
    assert s.rows["current"].sum() == 20 and (~s.rows["current"]).sum() == 2  # steps 11, 12 abandoned
    assert ("rollback", 12.0) in s.marks and ("pause", 20.0) in s.marks
    assert s.marks.count(("rollback", 12.0)) == 1  # in the HDF5 log and events.jsonl: one line
    [(lineage, lead)] = plot._segments(s.rows)
    assert list(lineage["step"])[lead - 1:] == [10, 11, 12]  # the dashed line starts where it forked
    assert not lineage["current"].iloc[lead:].any()


def test_time_and_tokens_axes(run):
    [s] = plot.load_series([target("r1", run)], ["reward/mean"], "tokens")
    assert s.rows["x"].iloc[-1] == pytest.approx(22 * 200.0)  # abandoned work counted: 22 rows x 200 tokens
    [t] = plot.load_series([target("r1", run)], ["reward/mean"], "time")
    assert t.rows["x"].iloc[0] == 0.0 and np.all(np.diff(t.rows["x"]) >= 0)


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".pdf", b"%PDF"), (".svg", b"<?xml")])
def test_cli_writes_each_format(run, tmp_path, capsys, suffix, magic):
    out = tmp_path / f"fig{suffix}"
    argv = ["plot", str(run), "-m", "reward/mean,kl/actor_ref", "-m", "val/score", "--smooth", "ema:0.9", "-o", str(out)]
    assert main(argv) == 0
    assert out.read_bytes().startswith(magic)
    assert f"wrote {out}: reward/mean, kl/actor_ref, val/score of 1 run over step" in capsys.readouterr().out


def test_png_is_small_and_sized_per_panel(run, tmp_path):
    out = plot.plot_runs([target("r1", run)], ["reward/mean", "kl/actor_ref", "kl/coef"], tmp_path / "f.png")
    width, height = struct.unpack(">II", out.read_bytes()[16:24])
    assert (width, height) == (800, 725) and out.stat().st_size < 100_000
    again = plot.plot_runs([target("r1", run)], ["reward/mean", "kl/actor_ref", "kl/coef"], tmp_path / "g.png")
    assert again.read_bytes() == out.read_bytes()  # no timestamp inside: a committed image does not churn


def test_runs_are_overlaid_and_found_by_id(tmp_path, capsys):
    root = tmp_path / "runs"
    for name in ("a-20260101-000000-aaaa", "b-20260101-000000-bbbb"):
        (root / name / "metrics").mkdir(parents=True)
        (root / name / "resolved.toml").write_text("")
        write_run(root / name, rollback_at=None)
    series = plot.load_series([target("a", root / "a-20260101-000000-aaaa"),
                               target("b", root / "b-20260101-000000-bbbb")],
                              ["reward/mean"], "step")
    assert [s.label for s in series] == ["a", "b"]
    out = tmp_path / "two.png"
    assert main(["plot", "a-20260101-000000-aaaa", "b-20260101-000000-bbbb", "-o", str(out), "--runs-root", str(root),
                 "-x", "time"]) == 0
    assert out.exists() and "of 2 runs over time" in capsys.readouterr().out


def test_a_metric_only_one_run_has_is_drawn_for_that_run(tmp_path):
    """A run with tools beside the same spec without them (tools/bench_tool_use.py): rollout/tool_calls_mean is in one
    log only; the figure draws it for that run and leaves the other's panel empty (it raised KeyError)."""
    with_tool, without = tmp_path / "tool", tmp_path / "off"
    for path in (with_tool, without):
        (path / "metrics").mkdir(parents=True)
        write_run(path, rollback_at=None, steps=4)
    with MetricsWriter(with_tool, [*STANDARD_COLUMNS, "rollout/tool_calls_mean"], attempt=1, swmr=False) as w:
        w.log(5, {"reward/mean": 0.9, "rollout/tool_calls_mean": 0.8})
    out = plot.plot_runs([target("tool", with_tool), target("off", without)], ["reward/mean", "rollout/tool_calls_mean"],
                         tmp_path / "both.png")
    assert out.stat().st_size > 1000


# ----------------------------------------------------------------------------- bad input: one line, non-zero
def _one_line_error(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc != 0 and err.count("\n") == 1 and err.startswith("hpcppo: error: "), err
    return rc, err


def test_unknown_metric_says_did_you_mean(run, tmp_path, capsys):
    rc, err = _one_line_error(capsys, ["plot", str(run), "-m", "reward/mean,kl/actor_rf", "-o", str(tmp_path / "f.png")])
    assert "unknown metric column 'kl/actor_rf'" in err and "did you mean 'kl/actor_ref'" in err
    assert not (tmp_path / "f.png").exists()


@pytest.mark.parametrize("extra, expected", [
    (["-o", "fig.jpg"], "unknown image format '.jpg'"),
    (["--smooth", "ema:1.5"], "--smooth 'ema:1.5'"),
    (["-x", "epoch"], "-x 'epoch': expected one of step, time, tokens"),
])  # fmt: skip
def test_bad_options(run, tmp_path, capsys, extra, expected):
    argv = ["plot", str(run), "-o", str(tmp_path / "f.png"), *extra]
    rc, err = _one_line_error(capsys, argv)
    assert rc == 2 and expected in err


def test_bad_runs(tmp_path, capsys):
    (tmp_path / "notes.h5").write_text("not hdf5")
    assert "notes.h5: " in _one_line_error(capsys, ["plot", str(tmp_path / "notes.h5")])[1]
    assert "no such run directory" in _one_line_error(capsys, ["plot", str(tmp_path / "nowhere")])[1]
    root = tmp_path / "runs"
    root.mkdir()
    assert "no run 'nope'" in _one_line_error(capsys, ["plot", "nope", "--runs-root", str(root)])[1]
    (root / "empty" / "metrics").mkdir(parents=True)
    rc, err = _one_line_error(capsys, ["plot", str(root / "empty"), "-o", str(tmp_path / "e.png")])
    assert "empty: has no metric file" in err and rc == 8
    (root / "empty" / "resolved.toml").write_text("")  # a run directory: why it has no rows
    rc, err = _one_line_error(capsys, ["plot", str(root / "empty"), "-o", str(tmp_path / "e.png")])
    assert "the run has not been submitted" in err and rc == 8


def test_tokens_axis_needs_the_throughput_columns(tmp_path, capsys):
    with MetricsWriter(tmp_path / "t.h5", ["reward/mean"], attempt=0, swmr=False) as w:
        w.log(1, {"reward/mean": 0.5})
    rc, err = _one_line_error(capsys, ["plot", str(tmp_path / "t.h5"), "-m", "reward/mean", "-x", "tokens",
                                       "-o", str(tmp_path / "t.png")])
    assert "unknown metric column 'perf/tokens_per_s'" in err
