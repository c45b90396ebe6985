"""The watchdog monitor's heartbeat: ``logs/attempt-<attempt>/watchdog.heartbeat`` (:meth:`RunPaths.monitor_heartbeat`).

The monitor (:mod:`hpcppo.watchdog.monitor`) rewrites it at every look at the run; ``hpcppo status`` reads it for a
running attempt and says when the monitor is not alive: a job whose monitor died, was never started (a batch host
without hpcppo) or cannot write the run directory has no hang detection, and nothing else would say so. The file
holds the writer's unix time and its interval; it is stale after :data:`STALE_INTERVALS` intervals plus
:data:`STALE_SLACK_S` (an HDF5 open that retries, a loaded host; and the clocks of the batch host and the login
node are compared). No torch, no config.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from hpcppo.fsutil import atomic_write_json
from hpcppo.rundir.paths import RunPaths

STALE_INTERVALS = 3
STALE_SLACK_S = 15.0


def write(run_dir: str | os.PathLike[str], attempt_key: str, *, interval_s: float) -> Path:
    """Record that the monitor of ``attempt_key`` is alive now (atomically: a reader never sees half a file; not
    durably: a heartbeat lost in a crash is only stale, which is what it then should be)."""
    path = RunPaths(run_dir).monitor_heartbeat(attempt_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_json(path, {"time": time.time(), "interval_s": interval_s, "pid": os.getpid(),
                                    "host": socket.gethostname()}, durable=False)  # no fsync at every look


def read(run_dir: str | os.PathLike[str], attempt_key: str) -> dict[str, Any] | None:
    """The heartbeat of ``attempt_key`` (None: none yet, or unreadable)."""
    try:
        data = json.loads(RunPaths(run_dir).monitor_heartbeat(attempt_key).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("time"), (int, float)):
        return None
    return data


def stale_after_s(interval_s: float) -> float:
    """Seconds without a new heartbeat after which the monitor counts as not alive."""
    return STALE_INTERVALS * interval_s + STALE_SLACK_S
