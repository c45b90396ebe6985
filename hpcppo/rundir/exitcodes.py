"""Exit codes of the job entry point and the exit record, shared by the trainer, the batch script and the monitor.

The batch script turns ``REQUEUE`` into ``scontrol requeue`` and ``PAUSED`` into a clean stop. ``srun`` reports the
highest code of all tasks (a task killed by ``--kill-on-bad-exit`` would mask 75/76), so rank 0 also writes its
verdict to ``control/exit-code.<attempt key>`` (:meth:`RunPaths.exit_record`); the watchdog monitor writes one
for a job it stops. The batch script and ``hpcppo status`` read it.
"""

from __future__ import annotations

import os

from hpcppo.fsutil import atomic_write_text
from hpcppo.rundir.paths import RunPaths

DONE = 0
FAILED = 1
# EX_TEMPFAIL: checkpointed on a preemption signal / time limit; requeue me.
REQUEUE = 75
# Stopped on request (pause rule, ``hpcppo pause``): do not requeue; ``hpcppo resume`` continues.
PAUSED = 76


def write_exit_record(run_dir: str | os.PathLike[str], attempt_key: str, code: int) -> None:
    """Record ``code`` as the verdict of job attempt ``attempt_key`` (atomically: a reader sees all or nothing)."""
    atomic_write_text(RunPaths(run_dir).exit_record(attempt_key), f"{int(code)}\n")


def read_exit_record(run_dir: str | os.PathLike[str], attempt_key: str) -> int | None:
    """The code recorded for ``attempt_key``; None when there is no record or it is not a number."""
    try:
        return int(RunPaths(run_dir).exit_record(attempt_key).read_text().strip())
    except (OSError, ValueError):
        return None
