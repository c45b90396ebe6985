"""The run's audit trail as the trainer writes it: one event in the attempt's HDF5 log and in ``events.jsonl``.

Rank 0 writes (every rank logs a line, so a rank's own log shows what it did). Used for the watchdog's actions,
``hpcppo rollback`` requests and damaged checkpoints found at resume; the monitor beside the trainer appends to
``events.jsonl`` itself (:mod:`hpcppo.watchdog.monitor`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from hpcppo.rundir.events import append_event

__all__ = ["Audit", "EventLog"]

log = logging.getLogger("hpcppo.train")


class EventLog(Protocol):
    """The metrics log's share: :meth:`hpcppo.metrics.MetricsWriter.log_event`."""

    def log_event(self, step: int, kind: str, message: str) -> None: ...


class Audit:
    """Where rank 0 records what was done to a run, and why."""

    def __init__(self, run_dir: Path, *, rank: int, metrics: EventLog | None, attempt: int | None):
        self.run_dir = run_dir
        self.rank = rank
        self.metrics = metrics
        self.attempt = attempt

    def record(self, step: int, kind: str, message: str, *, source: str = "watchdog", **details: Any) -> None:
        """One event, in the HDF5 log and in ``events.jsonl`` (rank 0), and in the job log (every rank)."""
        log.warning("%s at step %d: %s", kind, step, message)
        if self.rank != 0:
            return
        if self.metrics is not None:
            self.metrics.log_event(step, kind, message[:1000])
        append_event(self.run_dir, kind=kind, step=step, source=source, message=message, attempt=self.attempt,
                     **details)
