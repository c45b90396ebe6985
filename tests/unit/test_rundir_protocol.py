"""The run directory's protocol (``hpcppo.rundir``): where each file is, the exit record from Python to the batch
script and back, the pause files, the metric files' order. Writers and readers are different processes in a real
run; here each side is called as that process would."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpcppo.compiler import compile_config
from hpcppo.launch import render
from hpcppo.rundir import RunDir, RunPaths, control, events, exitcodes, metric_names
from hpcppo.rundir.paths import attempt_files_in, in_metrics_dir, is_metrics_dir

REPO = Path(__file__).resolve().parents[2]
RUN = Path("/runs/exp-20260101-000000-abcd")


def test_every_file_of_a_run_has_one_path():
    p = RunPaths(RUN)
    rel = {name: str(getattr(p, name).relative_to(RUN)) for name in (
        "spec", "resolved", "script", "run_json", "run_json_lock", "lock_file", "events", "preflight", "metrics",
        "checkpoints", "control", "logs", "submitit", "pause_request", "paused", "requests", "done", "rejected",
        "local_controller_log")}
    assert rel == {
        "spec": "spec.toml", "resolved": "resolved.toml", "script": "job.sbatch", "run_json": "run.json",
        "run_json_lock": ".run.json.lock", "lock_file": ".lock", "events": "events.jsonl",
        "preflight": "preflight.json", "metrics": "metrics", "checkpoints": "checkpoints", "control": "control",
        "logs": "logs", "submitit": "submitit", "pause_request": "control/PAUSE", "paused": "control/PAUSED",
        "requests": "control/requests", "done": "control/done", "rejected": "control/rejected",
        "local_controller_log": "logs/local-controller.log"}
    assert p.exit_record("4242.1") == RUN / "control/exit-code.4242.1"
    assert p.attempt_file(3) == RUN / "metrics/attempt-0003.h5"
    assert p.rank_log("4242.0", 7) == RUN / "logs/attempt-4242.0/rank-7.log"
    assert p.log_dir("local-99") == RUN / "logs/attempt-local-99"
    assert p.versions("4242.0") == RUN / "logs/attempt-4242.0/versions.json"
    assert p.batch_log("%j") == RUN / "logs/slurm-%j.out"
    assert p.run_id == RUN.name


def test_a_run_dir_is_its_paths():
    """``RunDir`` keeps its public paths (callers of the old ``launch.rundir.RunDir`` work unchanged)."""
    run = RunDir(RUN)
    assert isinstance(run, RunPaths)
    assert (run.resolved, run.metrics, run.control, run.logs) == (RUN / "resolved.toml", RUN / "metrics",
                                                                  RUN / "control", RUN / "logs")


def test_the_shell_names_leave_the_attempt_to_the_script():
    files = RunPaths.shell("$HPCPPO_ATTEMPT")
    assert files["exit_record"] == "control/exit-code.$HPCPPO_ATTEMPT"
    assert files["log_dir"] == "logs/attempt-$HPCPPO_ATTEMPT"
    assert files["rank_log"] == "rank-%t.log"
    # what the script builds from them is what the Python side builds for the same attempt
    assert RUN / files["exit_record"].replace("$HPCPPO_ATTEMPT", "17.2") == RunPaths(RUN).exit_record("17.2")
    assert RUN / files["log_dir"].replace("$HPCPPO_ATTEMPT", "17.2") == RunPaths(RUN).log_dir("17.2")
    assert files["watchdog_log"] == "watchdog.log"


def test_metric_files_are_listed_in_attempt_order(tmp_path):
    paths = RunPaths(tmp_path)
    paths.metrics.mkdir()
    for name in ("attempt-0010.h5", "attempt-0002.h5", "attempt-x.h5", "notes.txt", ".attempt-0003.h5.tmp"):
        (paths.metrics / name).write_text("")
    assert list(paths.attempt_files()) == [2, 10]
    assert [p.name for p in paths.attempt_files().values()] == ["attempt-0002.h5", "attempt-0010.h5"]
    assert attempt_files_in(tmp_path / "missing") == {}
    assert is_metrics_dir(paths.metrics) and in_metrics_dir(paths.attempt_file(2))
    assert not is_metrics_dir(tmp_path) and not in_metrics_dir(tmp_path / "attempt-0001.h5")


# ----------------------------------------------------------------------------- the exit record
def test_exit_record_round_trip(tmp_path):
    assert exitcodes.read_exit_record(tmp_path, "4242.0") is None
    exitcodes.write_exit_record(tmp_path, "4242.0", exitcodes.REQUEUE)
    assert exitcodes.read_exit_record(tmp_path, "4242.0") == 75
    assert RunPaths(tmp_path).exit_record("4242.0").read_text() == "75\n"
    RunPaths(tmp_path).exit_record("4242.1").write_text("garbage\n")
    assert exitcodes.read_exit_record(tmp_path, "4242.1") is None


def test_exit_records_of_a_job_by_restart(tmp_path):
    for key, code in (("4242.0", 75), ("4242.3", 0), ("42420.1", 1), ("local-4242", 0)):
        exitcodes.write_exit_record(tmp_path, key, code)
    found = RunPaths(tmp_path).exit_records_of("4242")
    assert sorted(found) == [0, 3]
    assert found[3] == RunPaths(tmp_path).exit_record("4242.3")
    assert RunPaths(tmp_path / "none").exit_records_of("4242") == {}


def _verdict_block(script: str) -> str:
    """The batch script's lines that replace srun's code by rank 0's exit record."""
    start = script.index("# Rank 0 records its verdict")
    end = script.index("\nfi\n", start) + len("\nfi\n")
    return script[start:end]


@pytest.mark.parametrize("recorded", [None, exitcodes.REQUEUE, exitcodes.PAUSED])
def test_the_batch_script_reads_the_exit_record_python_writes(tmp_path, recorded):
    """Rank 0 writes with :func:`write_exit_record`; the rendered script's own lines read it (srun said 137)."""
    c = compile_config(REPO / "examples" / "arith-tiny.toml", "local-slurm", [], check_paths=False)
    block = _verdict_block(render.render(c.site, c.experiment, c.plan, tmp_path, python="python3"))
    if recorded is not None:
        exitcodes.write_exit_record(tmp_path, "4242.0", recorded)
    out = subprocess.run(["bash", "-c", f"rc=137\n{block}echo \"$rc\""], capture_output=True, text=True, timeout=30,
                         env={"HPCPPO_RUN_DIR": str(tmp_path), "HPCPPO_ATTEMPT": "4242.0", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(137 if recorded is None else recorded)


# ----------------------------------------------------------------------------- pause
def test_pause_request_and_record(tmp_path):
    assert not control.pause_requested(tmp_path) and control.pause_reason_requested(tmp_path) == ""
    control.request_pause(tmp_path, "  operator: look at the KL \n")
    assert control.pause_requested(tmp_path)
    assert control.pause_reason_requested(tmp_path) == "operator: look at the KL"
    control.record_paused(tmp_path, 12, "operator: look at the KL")
    control.pause_served(tmp_path)
    assert not control.pause_requested(tmp_path)
    assert control.is_paused(tmp_path)
    assert control.paused_reason(tmp_path) == "step 12: operator: look at the KL"
    assert RunPaths(tmp_path).paused.read_text() == "step 12: operator: look at the KL\n"
    control.request_pause(tmp_path, "again")
    control.clear_pause(RunDir(tmp_path))  # `hpcppo resume`: both files go
    assert not control.pause_requested(tmp_path) and not control.is_paused(tmp_path)
    assert control.paused_reason(tmp_path) is None


def test_an_empty_paused_record_has_no_reason(tmp_path):
    RunPaths(tmp_path).control.mkdir()
    RunPaths(tmp_path).paused.write_text("\n")
    assert control.is_paused(tmp_path) and control.paused_reason(tmp_path) is None


# ----------------------------------------------------------------------------- headline metrics
def test_the_headline_metrics_are_columns_the_trainer_logs():
    names = [h.name for h in metric_names.HEADLINE]
    assert len(set(names)) == len(names)
    assert [n for n in names if not metric_names.is_trainer_column(n)] == []
    assert all(h.better in (None, "max", "min") and h.views and h.views <= set(metric_names.VIEWS)
               for h in metric_names.HEADLINE)
    assert all(metric_names.headline(v) for v in metric_names.VIEWS)  # no view left empty


def test_each_view_keeps_the_table_order():
    assert metric_names.headline_names("follow") == ("reward/mean", "kl/actor_ref", "kl/coef", "perf/tokens_per_s")
    order = [h.name for h in metric_names.HEADLINE]
    for view in metric_names.VIEWS:
        shown = metric_names.headline_names(view)
        assert list(shown) == sorted(shown, key=order.index)
    with pytest.raises(ValueError, match="unknown view 'table'; views: log, summary"):
        metric_names.headline("table")


# ----------------------------------------------------------------------------- event kinds
def test_every_event_kind_can_be_appended_and_reads_by_its_tail(tmp_path):
    from hpcppo.watchdog.decide import PRECEDENCE

    kinds = [events.watchdog_kind(a) for a in (*PRECEDENCE, events.SUPPRESSED)]
    kinds += [events.RESUME, events.PREEMPTED, events.PAUSED, events.REQUEUE, events.CHECKPOINT_CORRUPT,
              events.CONTROL_ROLLBACK, events.CONTROL_REJECTED, events.HANG, events.TRAINER_DEAD,
              events.MONITOR_ERROR, events.MONITOR_RESTARTED, events.RUN_MOVED]
    for kind in kinds:
        events.append_event(tmp_path, kind=kind, step=1, source="trainer")
    assert [e["kind"] for e in events.read_events(tmp_path)] == kinds
    assert events.watchdog_kind("rollback") == "watchdog.rollback"
    assert {events.kind_tail(k) for k in ("watchdog.pause", "pause")} == {"pause"}
