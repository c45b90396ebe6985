"""``hpcppo metrics export`` (Parquet/CSV, atomic) and ``hpcppo compare`` (config keys that differ, outcomes)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from hpcppo.analysis.compare import differing_keys
from hpcppo.cli import main
from hpcppo.metrics import MetricsWriter, load
from test_analysis_summary import compiled_run, story


@pytest.fixture()
def run(tmp_path):
    path = compiled_run(tmp_path / "runs")
    story(path)
    return path


def test_export_parquet_is_the_current_history(run, tmp_path, capsys):
    out = tmp_path / "out" / "m.parquet"
    out.parent.mkdir()  # -o writes only where the parent directory exists (issue 25)
    assert main(["metrics", "export", run.name, "--runs-root", str(run.parent), "-o", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}: 11 rows x 12 columns of {run.name} (parquet, the "
                                              "current history)")
    back = pd.read_parquet(out)
    pd.testing.assert_frame_equal(back, load(run), check_dtype=True)
    meta = pq.read_schema(out).metadata
    assert meta[b"hpcppo.run"] == run.name.encode() and json.loads(meta[b"hpcppo.damaged"]) == {}
    assert [p.name for p in out.parent.iterdir()] == ["m.parquet"]  # no temporary file left


def test_export_csv_of_every_row_and_some_columns(run, tmp_path, capsys):
    out = tmp_path / "m.data"
    assert main(["metrics", "export", str(run), "--format", "csv", "--all-attempts", "-o", str(out),
                 "--columns", "reward/mean,kl/coef"]) == 0
    back = pd.read_csv(out)
    every = load(run, attempts="all", branches="all", columns=["reward/mean", "kl/coef"])
    assert back.columns.tolist() == every.columns.tolist() and back.columns[-1] == "current"
    assert len(back) == 15 and back["current"].tolist() == every["current"].tolist()
    np.testing.assert_allclose(back["reward/mean"], every["reward/mean"])  # NaN as an empty cell, read back as NaN
    out.write_text("old")  # replaced whole
    assert main(["metrics", "export", str(run), "--format", "csv", "-o", str(out)]) == 0
    assert len(pd.read_csv(out)) == 11


@pytest.mark.parametrize(("argv", "message", "code"), [
    (["-o", "x.txt"], "x.txt: cannot tell the format from the suffix '.txt' (pass --format parquet", 2),
    (["-o", "x.csv", "--format", "xlsx"], "--format 'xlsx' is not one of parquet, csv", 2),
    (["-o", "x.csv", "--columns", "kl/coeff"], "unknown metric column 'kl/coeff' (did you mean 'kl/coef'", 1),
])
def test_export_errors_are_one_line(run, tmp_path, capsys, monkeypatch, argv, message, code):
    monkeypatch.chdir(tmp_path)
    assert main(["metrics", "export", str(run), *argv]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not list(tmp_path.glob("x.*"))


def test_export_into_a_directory_is_refused(run, tmp_path, capsys):
    assert main(["metrics", "export", str(run), "-o", str(tmp_path), "--format", "csv"]) == 5
    assert "is a directory" in capsys.readouterr().err


def test_differing_keys_include_keys_missing_from_a_run():
    assert differing_keys([{"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}]) == ["b", "c"]
    assert differing_keys([{"a": "1"}, {"a": "1"}]) == []


def test_compare_lists_the_differing_keys_and_the_outcomes(tmp_path, capsys):
    runs = tmp_path / "runs"
    a = compiled_run(runs)
    b = compiled_run(runs, "actor.lr=5e-6", "algorithm.kl_ctrl.kl_coef=0.01")
    story(a)
    with MetricsWriter(b, ["reward/mean", "kl/coef", "perf/step_time_s"], attempt=0) as w:
        for s in range(1, 31):
            w.log(s, {"reward/mean": 0.02 * s, "kl/coef": 0.01, "perf/step_time_s": 1.0})
    assert main(["compare", a.name, b.name, "--runs-root", str(runs), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["runs"] == [a.name, b.name]
    assert data["config"]["actor.lr"][1] == "5e-06"
    assert data["config"]["algorithm.kl_ctrl.kl_coef"] == ["0.001", "0.01"]
    assert "trainer.total_steps" not in data["config"] and data["config_notes"] == []
    assert [s["steps_done"] for s in data["summaries"]] == [10, 30]
    assert main(["compare", a.name, b.name, "--runs-root", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "config: " in out and "key(s) differ" in out and "actor.lr" in out
    assert "reward/mean last" in out and "10 of 30 steps (33%)" in out and "30 of 30 steps (100%)" in out
    assert "1 rollback" in out


def test_compare_with_a_bare_file_has_no_config(tmp_path, capsys, run):
    loose = tmp_path / "loose.h5"
    loose.write_bytes((run / "metrics" / "attempt-0001.h5").read_bytes())
    assert main(["compare", str(run), str(loose), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config_notes"] == ["loose.h5: no resolved.toml (a bare metric file)"]
    assert data["config"] == {}  # one config alone has nothing to differ from


def test_compare_needs_two_runs(run, capsys):
    assert main(["compare", str(run)]) == 1
    assert capsys.readouterr().err == "hpcppo: error: compare needs two runs or more, got 1\n"
