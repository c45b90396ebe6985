"""Exit codes of the job entry point and the exit record, shared by the trainer, the batch script and the monitor.

The batch script turns ``REQUEUE`` into ``scontrol requeue`` and ``PAUSED`` into a clean stop. ``srun`` reports the
highest code of all tasks (a task killed by ``--kill-on-bad-exit`` would mask 75/76), so rank 0 also writes its
verdict to ``control/exit-code.<attempt key>`` (:meth:`RunPaths.exit_record`); the watchdog monitor writes one
for a job it stops. The batch script and ``hpcppo status`` read it.

Format: the code alone on the first line; a failure that was diagnosed (a full disk, a damaged checkpoint: an
``HpcppoError``) adds its one-line explanation as the second line, which ``hpcppo status`` shows. The batch script
reads the first line only (``read -r rc``, ``templates/partials/launch.j2``).
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


MAX_REASON_CHARS = 2000  # an explanation is one line of the status; a longer one is cut


def write_exit_record(run_dir: str | os.PathLike[str], attempt_key: str, code: int, reason: str | None = None) -> None:
    """Record ``code`` as the verdict of job attempt ``attempt_key``, with ``reason`` (why, one line) when given
    (atomically: a reader sees all or nothing)."""
    text = f"{int(code)}\n"
    if reason:
        line = " ".join(reason.split())  # one line whatever it held
        text += (line if len(line) <= MAX_REASON_CHARS else line[:MAX_REASON_CHARS - 3] + "...") + "\n"
    atomic_write_text(RunPaths(run_dir).exit_record(attempt_key), text)


def _lines(run_dir: str | os.PathLike[str], attempt_key: str) -> list[str] | None:
    try:
        with open(RunPaths(run_dir).exit_record(attempt_key), "rb") as f:
            head = f.read(MAX_REASON_CHARS + 64)  # a record is two short lines; never more is read
    except OSError:
        return None
    return head.decode("utf-8", errors="replace").splitlines()


def read_exit_record(run_dir: str | os.PathLike[str], attempt_key: str) -> int | None:
    """The code recorded for ``attempt_key``; None when there is no record or its first line is not a number."""
    lines = _lines(run_dir, attempt_key)
    try:
        return int(lines[0].strip()) if lines else None
    except ValueError:
        return None


def read_exit_reason(run_dir: str | os.PathLike[str], attempt_key: str) -> str | None:
    """The explanation recorded with the code for ``attempt_key`` (its second line); None when there is none."""
    lines = _lines(run_dir, attempt_key)
    reason = lines[1].strip() if lines and len(lines) > 1 else ""
    return reason or None
