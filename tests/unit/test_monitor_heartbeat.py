"""The watchdog monitor's heartbeat (hpcppo.rundir.heartbeat): written by the monitor at every look, judged by
``hpcppo status`` for a running attempt (launch.runrecords.monitor_liveness). The dev-cluster test
(tests/slurm/test_watchdog_slurm.py) kills a real monitor and sees status say so."""

from __future__ import annotations

import json
import os
import socket
import time

from hpcppo.launch import runrecords, status, statustext
from hpcppo.rundir import RunDir, exitcodes, heartbeat
from hpcppo.watchdog.monitor import Monitor, Settings


def test_the_monitor_writes_its_heartbeat_when_it_looks(tmp_path):
    exitcodes.write_exit_record(tmp_path, "5.0", exitcodes.DONE)  # one look, then it ends
    before = time.time()
    assert Monitor(tmp_path, "5.0", Settings(interval_s=7.0, heartbeat_factor=3.0, min_heartbeat_s=1.0,
                                             scheduler="slurm")).run() == 0
    beat = json.loads(RunDir(tmp_path).monitor_heartbeat("5.0").read_text())
    assert (beat["interval_s"], beat["pid"], beat["host"]) == (7.0, os.getpid(), socket.gethostname())
    assert before <= beat["time"] <= time.time()
    assert RunDir(tmp_path).monitor_heartbeat("5.0") == tmp_path / "logs" / "attempt-5.0" / "watchdog.heartbeat"


def test_status_judges_the_heartbeat_of_a_running_attempt(tmp_path):
    run = RunDir(tmp_path)
    # none yet: starting within the grace, not alive after it
    assert runrecords.monitor_liveness(run, "5.0", 10.0).startswith("starting")
    assert runrecords.monitor_liveness(run, "5.0", 300.0) == ("not alive (no heartbeat in 0:05:00 of this attempt; hangs "
                                                          "go undetected; see logs/attempt-5.0/watchdog.log)")
    heartbeat.write(tmp_path, "5.0", interval_s=2.0)
    t = json.loads(run.monitor_heartbeat("5.0").read_text())["time"]
    assert heartbeat.stale_after_s(2.0) == 21.0
    assert runrecords.monitor_liveness(run, "5.0", 300.0, now=t + 21.0) == "alive"
    stale = runrecords.monitor_liveness(run, "5.0", 300.0, now=t + 22.0)
    assert stale.startswith(f"not alive (last heartbeat 22 s ago from pid {os.getpid()} on {socket.gethostname()}, "
                            f"more than 21 s; hangs go undetected; see logs/attempt-5.0/watchdog.log)")
    # the detail view prints it
    st = status.JobStatus(run_id="r", site="s", scheduler="slurm", job_id="5", state="RUNNING", elapsed_s=300.0,
                          attempts=1, restarts=0, path=str(tmp_path), monitor=stale)
    assert f"monitor     {stale}" in statustext.format_run(st, [])
