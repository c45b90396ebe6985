"""The process beside the trainer (hpcppo.watchdog.monitor): the hang arithmetic, following real SWMR metric
files written by MetricsWriter (missing, growing, half-written row, writer killed with -9, truncated, attempt
change), trainer liveness from /proc, and the loop's verdicts (exit record, hang, dead trainer, last look)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import attrs
import h5py
import pytest

from hpcppo.launch.slurm import parse_step_ids
from hpcppo.metrics import MetricsWriter
from hpcppo.rundir import exitcodes
from hpcppo.rundir.events import append_event, read_events
from hpcppo.watchdog import monitor
from hpcppo.watchdog.monitor import (LogFollower, Monitor, Settings, TrainerProcesses, heartbeat_threshold_s,
                                     startup_allowance_s, step_durations)

COLUMNS = ["reward/mean", "kl/actor_ref"]


# The most a monitor's reaction may lag its threshold here: far below the thresholds a wrong rule would wait for
# (the defaults' minutes, the 30 s heartbeat of the dead-trainer test), far above what a loaded 2-core machine adds.
SLACK_S = 20.0


# ----------------------------------------------------------------------------- arithmetic

def test_startup_allowance_until_two_rows_give_a_step_time():
    assert startup_allowance_s(600.0) == 1800.0
    assert heartbeat_threshold_s([], heartbeat_factor=10, min_heartbeat_s=600) == 1800.0
    assert heartbeat_threshold_s([], heartbeat_factor=10, min_heartbeat_s=3) == 9.0


def test_threshold_is_factor_times_the_median_but_at_least_the_minimum():
    assert heartbeat_threshold_s([2.0, 3.0, 100.0], heartbeat_factor=10, min_heartbeat_s=1) == 30.0  # median, not mean
    assert heartbeat_threshold_s([1.0, 1.0], heartbeat_factor=10, min_heartbeat_s=600) == 600.0
    assert heartbeat_threshold_s([60.0, 80.0], heartbeat_factor=10, min_heartbeat_s=600) == 700.0


def test_step_durations_skip_clock_steps_back_and_garbage():
    assert step_durations([10.0, 12.0, 15.0]) == [2.0, 3.0]
    assert step_durations([12.0, 15.0], previous=10.0) == [2.0, 3.0]
    assert step_durations([10.0, 9.0, 11.0, float("nan"), 13.0]) == [2.0]
    assert step_durations([]) == [] and step_durations([5.0]) == []


def test_parse_step_ids_keeps_srun_steps_only():
    text = "812.0\n812.batch\n812.extern\n812.3\n  \n812_4.1\n"
    assert parse_step_ids(text) == ["812.0", "812.3", "812_4.1"]
    assert parse_step_ids("") == []


# ----------------------------------------------------------------------------- following the log
def _writer(run_dir: Path, attempt: int = 0) -> MetricsWriter:
    return MetricsWriter(run_dir, COLUMNS, attempt=attempt)


def test_no_metrics_directory_or_file_yet(tmp_path):
    follower = LogFollower(tmp_path)
    st = follower.poll()
    assert (st.file_index, st.rows, st.new_rows, st.error) == (None, 0, 0, "no metric file yet")
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / ".attempt-0000.h5.123.tmp").write_bytes(b"half-created")  # the writer's temp name
    assert follower.poll().error == "no metric file yet"


def test_growing_file_rows_steps_and_step_times(tmp_path):
    follower = LogFollower(tmp_path)
    with _writer(tmp_path) as w:
        assert follower.poll().rows == 0  # created, no row yet
        for step in (1, 2, 3):
            w.log(step, {"reward/mean": step})
            time.sleep(0.02)
        st = follower.poll()
        assert (st.file_index, st.rows, st.new_rows, st.last_step, len(st.step_times)) == (0, 3, 3, 3, 2)
        assert all(0.015 < t < 1.0 for t in st.step_times)
        assert follower.poll().new_rows == 0
        w.log(4, {"reward/mean": 4.0})
        st = follower.poll()
        assert (st.rows, st.new_rows, st.last_step, len(st.step_times)) == (4, 1, 4, 3)


def test_a_half_written_row_is_not_counted_until_its_seq_is_written(tmp_path):
    with _writer(tmp_path) as w:
        w.log(1, {"reward/mean": 1.0})
        w.log(2, {"reward/mean": 2.0})
    path = w.path
    with h5py.File(path, "a") as f:  # what a reader can meet mid-append: every dataset grown, seq not written yet
        for name in ("step", "attempt", "branch", "time", "seq"):
            f[name].resize((3,))
        f["step"][2], f["time"][2] = 3, time.time()
    follower = LogFollower(tmp_path)
    st = follower.poll()
    assert (st.rows, st.last_step) == (2, 2)
    with h5py.File(path, "a") as f:
        f["seq"][2] = 2
    st = follower.poll()
    assert (st.rows, st.new_rows, st.last_step) == (3, 1, 3)


def test_rows_of_a_writer_killed_with_sigkill_are_read(tmp_path):
    code = textwrap.dedent(f"""
        import sys, time
        from hpcppo.metrics import MetricsWriter
        w = MetricsWriter({str(tmp_path)!r}, {COLUMNS!r}, attempt=0)
        for step in range(1, 6):
            w.log(step, {{"reward/mean": float(step)}})
        print("ready", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        follower = LogFollower(tmp_path)
        assert follower.poll().rows == 5  # while the writer holds the file
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        st = follower.poll()
        assert (st.rows, st.new_rows, st.last_step, st.error) == (5, 0, 5, None)
        assert LogFollower(tmp_path).poll().rows == 5  # a fresh reader too
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("fraction", [0.05, 0.2, 0.5, 0.9])
def test_a_truncated_file_never_blocks_the_reader(tmp_path, fraction):
    source = tmp_path / "src"
    with MetricsWriter(source, COLUMNS, attempt=0) as w:
        for step in range(1, 201):
            w.log(step, {"reward/mean": float(step)})
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    target = run / "metrics" / w.path.name
    shutil.copy(w.path, target)
    os.truncate(target, int(target.stat().st_size * fraction))
    follower = LogFollower(run)
    t0 = time.monotonic()
    st = follower.poll()  # HDF5's default of 100 SWMR metadata retries would sleep ~2^100 ns here
    assert time.monotonic() - t0 < 60.0  # a hang is ~2^100 ns; a busy machine is merely slow
    # Either an error ("no new row") or rows that are really whole: the zero-filled tail never passes seq[i] == i.
    assert st.error is not None or st.rows <= 200
    assert st.rows == 0 or st.last_step == st.rows


def test_an_attempt_change_is_followed_and_older_files_are_ignored(tmp_path):
    with _writer(tmp_path, 0) as w0:
        for step in (1, 2, 3):
            w0.log(step, {})
    follower = LogFollower(tmp_path, first_index=1)  # a monitor started for attempt 2: attempt-0000 is history
    assert follower.poll().error == "no metric file yet"
    with _writer(tmp_path, 1) as w1:
        w1.log(3, {})
        st = follower.poll()
        assert (st.file_index, st.rows, st.last_step, st.switched) == (1, 1, 3, True)
        w1.log(4, {})
        st = follower.poll()
        assert (st.rows, st.switched, len(st.step_times)) == (2, False, 1)
    with _writer(tmp_path, 2) as w2:  # another attempt appears: follow it, forget the last one's rows
        st = follower.poll()
        assert (st.file_index, st.rows, st.last_step, st.step_times, st.switched) == (2, 0, None, (), True)
        w2.log(5, {})
        assert follower.poll().last_step == 5


# ----------------------------------------------------------------------------- trainer processes
def _fake_trainer(run_dir: Path, attempt: str) -> subprocess.Popen:
    """A process that looks like a rank of the job entry point to the monitor (name and arguments)."""
    env = dict(os.environ, HPCPPO_ATTEMPT=attempt)
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "-m", monitor.ENTRY_MODULE,
                             str(run_dir)], env=env)


def test_trainer_processes_are_found_by_entry_point_run_dir_and_attempt(tmp_path):
    mine = _fake_trainer(tmp_path, "7.0")
    other_attempt = _fake_trainer(tmp_path, "7.1")
    other_run = _fake_trainer(tmp_path / "elsewhere", "7.0")
    try:
        procs = TrainerProcesses(tmp_path, "7.0")
        deadline = time.monotonic() + 10
        while procs.alive() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(procs.known) == {mine.pid}
        mine.kill()
        mine.wait()
        assert procs.alive() is False
    finally:
        for p in (mine, other_attempt, other_run):
            p.kill()
            p.wait()
    assert TrainerProcesses(tmp_path, "9.0").alive() is None  # never seen


# ----------------------------------------------------------------------------- the loop
def _settings(**kw) -> Settings:
    return Settings(**({"interval_s": 0.2, "heartbeat_factor": 3.0, "min_heartbeat_s": 1.0, "scheduler": "slurm"}
                       | kw))


def _exit_record(run_dir: Path, attempt: str, code: int) -> None:
    (run_dir / "control").mkdir(exist_ok=True)
    (run_dir / "control" / f"exit-code.{attempt}").write_text(f"{code}\n")


def test_an_exit_record_ends_the_monitor_without_an_event(tmp_path):
    _exit_record(tmp_path, "5.0", exitcodes.DONE)
    assert Monitor(tmp_path, "5.0", _settings()).run() == 0
    assert read_events(tmp_path) == []


def test_a_hang_is_recorded_then_acted_on(tmp_path, monkeypatch):
    acted = []
    monkeypatch.setattr(Monitor, "stop_slurm_steps", lambda self, code: acted.append(code))
    with _writer(tmp_path) as w:
        for step in (1, 2, 3):
            w.log(step, {})
            time.sleep(0.1)
        t_last = time.monotonic()
        mon = Monitor(tmp_path, "5.0", _settings(), first_index=0)
        assert mon.run() == 0
        latency = time.monotonic() - t_last
    assert acted == [exitcodes.REQUEUE]
    (hang,) = read_events(tmp_path)
    assert (hang["kind"], hang["source"], hang["step"], hang["attempt"], hang["action"]) == ("hang", "monitor", 3, 0,
                                                                                           "requeue")
    assert hang["threshold_s"] == 1.0  # 3 x ~0.1 s median < min_heartbeat_s
    assert hang["seconds_since_row"] >= 1.0 and hang["job_attempt"] == "5.0"
    # Not before the threshold; and at it, not at some later, unrelated time (the defaults would be minutes). The
    # upper bound leaves a busy machine its scheduling delays: a timing race is a defect (the brief).
    assert 1.0 <= latency < SLACK_S


def test_before_the_first_row_the_startup_allowance_applies(tmp_path, monkeypatch):
    acted = []
    monkeypatch.setattr(Monitor, "stop_slurm_steps", lambda self, code: acted.append(code))
    t0 = time.monotonic()
    assert Monitor(tmp_path, "5.0", _settings(min_heartbeat_s=0.5)).run() == 0
    # 3 x min_heartbeat_s, not min_heartbeat_s (below) nor the default allowance of minutes (above)
    assert 1.5 <= time.monotonic() - t0 < SLACK_S
    (hang,) = read_events(tmp_path)
    assert hang["step"] is None and hang["threshold_s"] == 1.5


def test_after_max_restarts_a_hang_stops_the_job_instead(tmp_path, monkeypatch):
    acted = []
    monkeypatch.setattr(Monitor, "stop_slurm_steps", lambda self, code: acted.append(code))
    for _ in range(2):
        append_event(tmp_path, kind="hang", step=3, source="monitor", action="requeue")
    assert Monitor(tmp_path, "5.0", _settings(min_heartbeat_s=0.2, max_restarts=2)).run() == 0
    assert acted == [exitcodes.FAILED]
    assert read_events(tmp_path, last=1)[0]["action"] == "cancel"


def test_a_failed_action_is_recorded(tmp_path, monkeypatch):
    def boom(self, code):
        raise RuntimeError("scancel: no such step")

    monkeypatch.setattr(Monitor, "stop_slurm_steps", boom)
    assert Monitor(tmp_path, "5.0", _settings(min_heartbeat_s=0.2)).run() == 1
    assert [e["kind"] for e in read_events(tmp_path)] == ["hang", "monitor.error"]
    assert "RuntimeError: scancel: no such step" in read_events(tmp_path)[-1]["message"]


def test_a_dead_trainer_is_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(monitor, "DEAD_GRACE_S", 0.5)
    trainer = _fake_trainer(tmp_path, "6.0")
    mon = Monitor(tmp_path, "6.0", _settings(min_heartbeat_s=30.0))
    try:
        deadline = time.monotonic() + 10
        while mon.trainers.alive() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        trainer.kill()
        trainer.wait()
    t0 = time.monotonic()
    assert mon.run() == 0
    assert time.monotonic() - t0 < SLACK_S  # DEAD_GRACE_S (0.5 s) after, not the 30 s heartbeat
    (dead,) = read_events(tmp_path)
    assert (dead["kind"], dead["source"]) == ("trainer_dead", "monitor")


def test_the_last_look_on_sigterm_records_a_trainer_gone_without_a_verdict(tmp_path):
    trainer = _fake_trainer(tmp_path, "8.0")
    mon = Monitor(tmp_path, "8.0", _settings(min_heartbeat_s=30.0))
    deadline = time.monotonic() + 10
    while mon.trainers.alive() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    trainer.kill()
    trainer.wait()
    mon._stop = signal.SIGTERM  # what the batch script's EXIT trap delivers right after srun returned
    assert mon.run() == 0
    assert [e["kind"] for e in read_events(tmp_path)] == ["trainer_dead"]


def test_the_last_look_records_nothing_while_the_trainers_still_run(tmp_path):
    trainer = _fake_trainer(tmp_path, "8.0")  # a whole-job scancel: TERM reaches monitor and trainers at once
    try:
        mon = Monitor(tmp_path, "8.0", _settings(min_heartbeat_s=30.0))
        deadline = time.monotonic() + 10
        while mon.trainers.alive() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        mon._stop = signal.SIGTERM
        assert mon.run() == 0
    finally:
        trainer.kill()
        trainer.wait()
    assert read_events(tmp_path) == []


def test_the_entry_point_exits_at_once_when_the_job_already_ended(tmp_path):
    """python -m hpcppo.watchdog on a compiled local run whose attempt has an exit record; no torch import."""
    from hpcppo.launch import jobs

    spec = Path(__file__).resolve().parents[2] / "examples" / "arith-tiny.toml"
    run = jobs.compile_run(spec, "local", ["watchdog.interval_s=0.2"], runs_root=str(tmp_path), check_paths=False)
    _exit_record(run.run.path, "local-1", exitcodes.DONE)
    code = ("import runpy, sys; sys.argv = ['x', sys.argv[1], '--attempt', 'local-1']; "
            "from hpcppo.watchdog.__main__ import main; rc = main(); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, str(run.run.path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "exit record 0 of attempt local-1" in proc.stdout


def test_locally_a_trainer_gone_after_a_users_cancel_is_not_dead(tmp_path, monkeypatch):
    from hpcppo.rundir import RunDir

    monkeypatch.setattr(monitor, "DEAD_GRACE_S", 0.3)
    run = RunDir(tmp_path)
    run.add_attempt(job_id="4242", scheduler="local", state="RUNNING", submitted_at="2026-01-01T00:00:00+00:00",
                    kind="submit")
    run.update_attempt("4242", cancel_requested_at="2026-01-01T00:01:00+00:00")  # what `hpcppo cancel` records
    trainer = _fake_trainer(tmp_path, "local-4242")
    mon = Monitor(tmp_path, "local-4242", _settings(scheduler="local", min_heartbeat_s=30.0))
    deadline = time.monotonic() + 10
    while mon.trainers.alive() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    trainer.kill()
    trainer.wait()
    assert mon.run() == 0
    assert read_events(tmp_path) == []


# ----------------------------------------------------------------------------- a monitor ends with its attempt (issue 25)
# Monitors outlived their attempt: one that started for an attempt which failed at start followed the next attempt's
# metric file and, after the run had COMPLETED, recorded a false hang and tried to restart it. Each case below keeps a
# trainer of the monitor's own attempt alive (a real process) and a threshold that would call a hang within a second:
# the monitor must end on its own, record nothing false and never act.
def _acting(monkeypatch) -> list:
    acted = []
    monkeypatch.setattr(Monitor, "stop_slurm_steps", lambda self, code: acted.append(("stop", code)))
    monkeypatch.setattr(Monitor, "restart_local", lambda self, recover: acted.append(("restart", recover)))
    return acted


def _run_with_trainer(run_dir: Path, attempt: str, settings: Settings, **kw) -> tuple[int, float]:
    trainer = _fake_trainer(run_dir, attempt)
    try:
        mon = Monitor(run_dir, attempt, settings, **kw)
        deadline = time.monotonic() + 10
        while mon.trainers.alive() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        t0 = time.monotonic()
        rc = mon.run()
        return rc, time.monotonic() - t0
    finally:
        trainer.kill()
        trainer.wait()


def test_a_monitor_ends_when_a_newer_attempt_is_recorded(tmp_path, monkeypatch):
    from hpcppo.rundir import RunDir

    acted = _acting(monkeypatch)
    run = RunDir(tmp_path)
    run.add_attempt(job_id="31", scheduler="slurm", state="FAILED", kind="submit")
    run.add_attempt(job_id="32", scheduler="slurm", state="PENDING", kind="resume")
    rc, took = _run_with_trainer(tmp_path, "31.0", _settings(min_heartbeat_s=0.3))
    assert (rc, acted, read_events(tmp_path)) == (0, [], []) and took < 10.0  # loose: a busy machine


def test_a_monitor_whose_attempt_is_not_recorded_yet_keeps_watching(tmp_path, monkeypatch):
    """The submitter records a local attempt once its controller runs: a monitor started before that is not over."""
    from hpcppo.rundir import RunDir

    acted = _acting(monkeypatch)
    RunDir(tmp_path).add_attempt(job_id="30", scheduler="slurm", state="FAILED", kind="submit")
    rc, _ = _run_with_trainer(tmp_path, "31.0", _settings(min_heartbeat_s=0.3))
    assert rc == 0 and acted == [("stop", exitcodes.REQUEUE)]  # its own hang: acted on
    assert [e["kind"] for e in read_events(tmp_path)] == ["hang"]


def test_a_monitor_never_follows_another_attempts_metric_file(tmp_path, monkeypatch):
    """Its own attempt failed before writing a file; the next attempt writes the file it waited for."""
    acted = _acting(monkeypatch)
    monkeypatch.setenv("HPCPPO_ATTEMPT", "41.0")
    with _writer(tmp_path, 0) as w:  # the index monitor 40.0 expects (no file when it started)
        for step in (1, 2):
            w.log(step, {})
        rc, took = _run_with_trainer(tmp_path, "40.0", _settings(min_heartbeat_s=0.3), first_index=0)
    assert (rc, acted, read_events(tmp_path)) == (0, [], []) and took < 10.0  # loose: a busy machine
    with h5py.File(tmp_path / "metrics" / "attempt-0000.h5", "r") as f:
        assert f.attrs["job_attempt"] == "41.0"


def test_a_monitor_follows_its_own_attempts_file(tmp_path, monkeypatch):
    acted = _acting(monkeypatch)
    monkeypatch.setenv("HPCPPO_ATTEMPT", "40.0")
    with _writer(tmp_path, 0) as w:
        w.log(1, {})
        rc, _ = _run_with_trainer(tmp_path, "40.0", _settings(min_heartbeat_s=0.3), first_index=0)
    assert rc == 0 and acted == [("stop", exitcodes.REQUEUE)]
    assert [(e["kind"], e["step"]) for e in read_events(tmp_path)] == [("hang", 1)]


def test_a_monitor_ends_when_another_attempt_completed_the_run(tmp_path, monkeypatch):
    acted = _acting(monkeypatch)
    _exit_record(tmp_path, "50.1", exitcodes.DONE)
    _exit_record(tmp_path, "49.0", exitcodes.REQUEUE)  # an earlier stop says nothing about the run being done
    rc, took = _run_with_trainer(tmp_path, "50.0", _settings(min_heartbeat_s=0.3))
    assert (rc, acted, read_events(tmp_path)) == (0, [], []) and took < 10.0  # loose: a busy machine


def test_a_monitor_ends_when_the_last_step_is_committed(tmp_path, monkeypatch):
    from hpcppo.rundir import checkpoints

    acted = _acting(monkeypatch)
    final = checkpoints.step_dir(tmp_path / "checkpoints", 6)
    final.mkdir(parents=True)
    checkpoints.write_marker(final, {"step": 6, "files": {}})
    rc, took = _run_with_trainer(tmp_path, "60.0", _settings(min_heartbeat_s=0.3, total_steps=6))
    assert (rc, acted, read_events(tmp_path)) == (0, [], []) and took < 10.0  # loose: a busy machine
    rc, _ = _run_with_trainer(tmp_path, "61.0", _settings(min_heartbeat_s=0.3, total_steps=8))  # not the last step
    assert rc == 0 and acted == [("stop", exitcodes.REQUEUE)]


def test_a_monitor_whose_trainers_never_appear_ends_and_says_so(tmp_path, monkeypatch):
    """An attempt that failed at start: no trainer process ever, no exit record."""
    acted = _acting(monkeypatch)
    monkeypatch.setattr(monitor, "NEVER_SEEN_S", 0.5)
    t0 = time.monotonic()
    assert Monitor(tmp_path, "70.0", _settings(min_heartbeat_s=30.0)).run() == 0
    assert time.monotonic() - t0 < 10.0 and acted == []
    (dead,) = read_events(tmp_path)
    assert dead["kind"] == "trainer_dead" and "no trainer process of attempt 70.0 appeared" in dead["message"]


def _fake_controller(run_dir: Path) -> subprocess.Popen:
    """What status takes for a local job's submitit controller: a process naming submitit and the run's folder."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "submitit",
                             str(run_dir / "submitit")])


def test_a_local_monitor_ends_when_its_controller_is_gone(tmp_path, monkeypatch):
    acted = _acting(monkeypatch)
    controller = _fake_controller(tmp_path)
    trainer = _fake_trainer(tmp_path, f"local-{controller.pid}")
    try:
        mon = Monitor(tmp_path, f"local-{controller.pid}", _settings(scheduler="local", min_heartbeat_s=30.0))
        deadline = time.monotonic() + 10
        while mon.trainers.alive() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mon.attempt_over() is None  # the job runs
        controller.kill()
        controller.wait()
        t0 = time.monotonic()
        assert mon.run() == 0 and time.monotonic() - t0 < 10.0
    finally:
        for p in (controller, trainer):
            p.kill()
            p.wait()
    assert acted == [] and read_events(tmp_path) == []


def test_a_local_monitor_never_restarts_a_completed_run(tmp_path):
    """The real restart path (no stand-in): a hang seen after the run's last step committed restarts nothing."""
    from hpcppo.launch import jobs
    from hpcppo.rundir import RunDir, checkpoints

    spec = Path(__file__).resolve().parents[2] / "examples" / "arith-tiny.toml"
    run = jobs.compile_run(spec, "local", ["trainer.total_steps=3"], runs_root=str(tmp_path), check_paths=False).run
    controller = _fake_controller(run.path)
    job = str(controller.pid)
    trainer = _fake_trainer(run.path, f"local-{job}")
    try:
        RunDir(run.path).add_attempt(job_id=job, scheduler="local", state="RUNNING", kind="submit")
        settings, _ = monitor.settings_from_run(run.path, interval_s=0.2)
        settings = attrs.evolve(settings, min_heartbeat_s=0.3)
        assert settings.total_steps == 3
        mon = Monitor(run.path, f"local-{job}", settings)
        deadline = time.monotonic() + 10
        while mon.trainers.alive() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        final = checkpoints.step_dir(run.checkpoints, 3)
        final.mkdir(parents=True)
        checkpoints.write_marker(final, {"step": 3, "files": {}})
        assert mon.run() == 0
        assert controller.poll() is None  # not cancelled
    finally:
        for p in (controller, trainer):
            p.kill()
            p.wait()
    assert len(run.read_record()["attempts"]) == 1
    assert read_events(run.path) == []
