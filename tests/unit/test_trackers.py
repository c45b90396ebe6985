"""Experiment trackers beside the HDF5 log: TensorBoard event files read back with TensorBoard's own reader, wandb
offline runs read back in wandb's run format (its protobuf records), ``metrics export --format tensorboard``, and
the spec's refusals (verl's other trackers, a missing package, a project without wandb)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpcppo.cli import main
from hpcppo.config import experiment as exp
from hpcppo.config.compiled import check_trackers_installed
from hpcppo.config.fields import FieldValueError
from hpcppo.errors import ConfigError
from hpcppo.metrics import MetricsWriter, trackers
from hpcppo.rundir import RunPaths

from trackerfiles import tensorboard_scalars, wandb_records


ROWS = [(1, {"reward/mean": 0.25, "val/score/hpcppo/arith/best@4/mean": 0.5}), (2, {"reward/mean": 0.75})]


def test_tensorboard_sink_writes_what_tensorboard_reads(tmp_path):
    sinks = trackers.open_trackers(["console", "tensorboard"], tmp_path / "run", project="p", group="g", attempt=3,
                                   config={})
    assert sinks.names == ["tensorboard"]
    for step, values in ROWS:
        sinks.log(step, values)
    sinks.close()
    logdir = RunPaths(tmp_path / "run").tensorboard
    assert [p.name.endswith(".attempt-3") for p in logdir.iterdir()] == [True]
    got = tensorboard_scalars(logdir)
    assert got["reward/mean"] == [(1, 0.25), (2, 0.75)]
    assert got["val/score/hpcppo/arith/best@4/mean"] == [(1, 0.5)]


def test_wandb_sink_writes_an_offline_run(tmp_path):
    run_dir = tmp_path / "arith-20261201-120000-abcd"
    sinks = trackers.open_trackers(["wandb"], run_dir, project="proj", group="arith", attempt=0,
                                   config={"actor": {"lr": 1e-4}})
    for step, values in ROWS:
        sinks.log(step, values)
    sinks.log(1, {"reward/mean": 9.0})  # a rollback re-logs step 1: wandb would refuse it; the HDF5 log keeps it
    sinks.close()
    [run_file] = RunPaths(run_dir).wandb.glob("offline-run-*/run-*.wandb")
    records = wandb_records(run_file)
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.run_id, run.project, run.display_name, run.run_group) == (run_dir.name, "proj", run_dir.name, "arith")
    history = [{(i.key or "/".join(i.nested_key)): i.value_json for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [(h["_step"], h["reward/mean"]) for h in history] == [("1", "0.25"), ("2", "0.75")]
    assert history[0]["val/score/hpcppo/arith/best@4/mean"] == "0.5"


def test_metrics_export_writes_a_finished_runs_log_as_event_files(tmp_path, capsys):
    run = tmp_path / "runs" / "exp-20261201-120000-abcd"
    with MetricsWriter(run, ("reward/mean", "kl/coef"), attempt=0) as w:
        w.log(1, {"reward/mean": 0.5, "kl/coef": 0.001})
        w.log(2, {"reward/mean": 0.75})
    code = main(["metrics", "export", str(run), "--format", "tensorboard"])
    out = capsys.readouterr().out
    assert code == 0 and "3 scalars over 2 rows" in out
    got = tensorboard_scalars(RunPaths(run).tensorboard)
    assert got == {"reward/mean": [(1, 0.5), (2, 0.75)], "kl/coef": [(1, pytest.approx(0.001))]}
    assert main(["metrics", "export", str(run)]) != 0
    assert "-o FILE is required" in capsys.readouterr().err
    # Exporting again replaces the previous export (one file, each point once).
    assert main(["metrics", "export", str(run), "--format", "tensorboard"]) == 0
    assert len(list(RunPaths(run).tensorboard.iterdir())) == 1
    assert tensorboard_scalars(RunPaths(run).tensorboard)["reward/mean"] == [(1, 0.5), (2, 0.75)]
    # Beside the trainer's own event files, the default directory is refused (the points would show twice).
    trackers.open_trackers(["tensorboard"], run, project="p", group="g", attempt=0, config={}).close()
    assert main(["metrics", "export", str(run), "--format", "tensorboard"]) != 0
    assert "holds the event files the trainer wrote" in capsys.readouterr().err
    assert main(["metrics", "export", str(run), "--format", "tensorboard", "-o", str(tmp_path / "tb")]) == 0


def test_the_spec_refuses_trackers_it_cannot_honour(monkeypatch):
    assert trackers.LOGGERS == exp.LOGGERS
    with pytest.raises(FieldValueError, match="'mlflow' is a verl tracker hpcppo does not have"):
        exp.TrainerSection(logger=["console", "mlflow"])
    with pytest.raises(FieldValueError, match="project_name: names wandb's project and does nothing without"):
        exp.TrainerSection(project_name="rlhf")
    site = type("S", (), {"name": "local", "env": type("E", (), {"python": "", "setup": []})(),
                          "container": type("C", (), {"runtime": "none"})()})()
    spec = type("X", (), {"trainer": exp.TrainerSection(logger=["console", "wandb"])})()
    check_trackers_installed(site, spec)  # installed here
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a))
    with pytest.raises(ConfigError, match=r"trainer.logger names wandb, not installed in .*hpcppo\[trackers\]"):
        check_trackers_installed(site, spec)
    with pytest.raises(ConfigError, match="trainer.logger names wandb, which is not installed"):
        trackers.require(["console", "wandb"])


def test_the_login_node_commands_do_not_import_the_trackers():
    code = ("import sys; from hpcppo.cli import seeing, parser; from hpcppo.metrics import trackers; "
            "from hpcppo.analysis import export; "
            "print(sorted(m for m in ('tensorboard', 'wandb', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_resumed_attempt_hides_the_steps_it_replays_from_tensorboard(tmp_path):
    """Attempt 0 logged steps 1-5 and died after checkpoint 3; attempt 1 resumes and logs 4-6 again. TensorBoard
    reads each step once, the replayed ones with attempt 1's values (no zigzag)."""
    first = trackers.open_trackers(["tensorboard"], tmp_path / "run", project="p", group="g", attempt=0, config={})
    for step in range(1, 6):
        first.log(step, {"reward/mean": float(step)})
    first.close()
    second = trackers.open_trackers(["tensorboard"], tmp_path / "run", project="p", group="g", attempt=1, config={})
    second.start_at(4)
    for step in range(4, 7):
        second.log(step, {"reward/mean": step + 0.5})
    second.close()
    got = tensorboard_scalars(RunPaths(tmp_path / "run").tensorboard)
    assert got["reward/mean"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.5), (5, 5.5), (6, 6.5)]
