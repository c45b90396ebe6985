"""HDF5 metric log: written by global rank 0 during training, read live by the watchdog and the CLI.

The analysis API (no torch: the login-node CLI imports this package)::

    df = hpcppo.metrics.load("runs/RUN_ID")                                  # one row per step, current history
    every = hpcppo.metrics.load(run, attempts="all", branches="all")         # every row, with a `current` column
    both = hpcppo.metrics.load_many(["runs/A", "runs/B"])                    # a `run` column first
    ev = hpcppo.metrics.events(run)                                          # HDF5 events + events.jsonl, by time
    df, logged = hpcppo.metrics.load_with_logged(run)                        # + which cells were logged (NaN or not)

Layout and design choices: :mod:`.schema` and ``docs/metrics.md``.
"""

from __future__ import annotations

from hpcppo.metrics.eventlog import events
from hpcppo.metrics.reader import load, load_events, load_many, load_with_logged, metric_files, superseded_mask
from hpcppo.metrics.schema import STANDARD_COLUMNS, UnknownColumnError
from hpcppo.metrics.writer import MetricsWriter
from hpcppo.rundir.paths import attempt_filename

__all__ = [
    "STANDARD_COLUMNS",
    "MetricsWriter",
    "UnknownColumnError",
    "attempt_filename",
    "events",
    "load",
    "load_events",
    "load_many",
    "load_with_logged",
    "metric_files",
    "superseded_mask",
]
