"""HDF5 metric log: written by global rank 0 during training, read live by the watchdog and the CLI.

No torch here (the login-node CLI imports this package). Layout and design choices: :mod:`.schema`.
"""

from __future__ import annotations

from hpcppo.metrics.reader import load, load_events, metric_files, superseded_mask
from hpcppo.metrics.schema import STANDARD_COLUMNS, UnknownColumnError, attempt_filename
from hpcppo.metrics.writer import MetricsWriter

__all__ = [
    "STANDARD_COLUMNS",
    "MetricsWriter",
    "UnknownColumnError",
    "attempt_filename",
    "load",
    "load_events",
    "metric_files",
    "superseded_mask",
]
