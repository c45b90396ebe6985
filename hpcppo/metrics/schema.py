"""The on-disk layout of a metric log, its standard columns, and column-name checks.

One HDF5 file per attempt: ``<run>/metrics/attempt-0001.h5``. A later attempt (requeue, resume) never reopens
an earlier attempt's file for writing, so a file whose writer was killed needs no repair: the next attempt
simply starts its own file, and the history of every attempt stays byte-for-byte as it was written.

Layout of one file (every object is created before SWMR is switched on; nothing is created afterwards)::

    /                   attrs: format="hpcppo.metrics", format_version=1, attempt, created_unix,
                               columns = the metric names, in order (fixed-length UTF-8 strings)
    /step     (N,)      int64    training step of the row
    /attempt  (N,)      int32    attempt number (constant within a file; kept so rows are self-describing)
    /branch   (N,)      int64    0, then +1 each time a step <= the previous one is logged (a rollback)
    /seq      (N,)      int64    0, 1, 2, ... order of logging within the attempt; written last: the commit mark
    /time     (N,)      float64  unix time at which the row was logged
    /values   (N, C)    float64  metric values, column j named by ``columns[j]``; NaN where not logged (or NaN)
    /logged   (N, C)    uint8    1 where the row logged column j (its value may be NaN), 0 where it did not;
                                 files written before it existed have none: NaN there means either
    /events/step (E,) int64, /events/time (E,) float64, /events/kind (E,) UTF-8[64], /events/message (E,) UTF-8[1024]

Why one 2-D ``values`` dataset instead of one dataset per metric: metric names are namespaced with ``/``
(``actor/pg_loss``), which HDF5 reads as a group path; and appending one row to 40 separate datasets costs
40 resizes and 40 writes per step: with SWMR and a flush per row, 45 one-column datasets measured 6-8x
slower than 5 structural datasets + one 2-D dataset (100-230 against 750-1,500 rows/s on a shared 2-core box).
The original names live, unescaped, in the ``columns`` attribute.

Why fixed-length strings for events: HDF5 does not support variable-length data under SWMR (a reader of a
file still open for writing can fail on them, h5py issue #1273). Messages longer than 1024 bytes are
truncated at a character boundary.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Sequence

import h5py
import numpy as np

from hpcppo.errors import HpcppoError

FORMAT = "hpcppo.metrics"
FORMAT_VERSION = 1

#: Structural per-row datasets, their dtypes and their fill values (what a row not yet written reads as).
STRUCTURAL: dict[str, tuple[type, int | float]] = {
    "step": (np.int64, -1),
    "attempt": (np.int32, -1),
    "branch": (np.int64, -1),
    "seq": (np.int64, -1),
    "time": (np.float64, np.nan),
}
VALUES = "values"
LOGGED = "logged"  # (N, C) uint8: which cells a row logged (absent from files written before it existed)
EVENTS = "events"
KIND_BYTES = 64
MESSAGE_BYTES = 1024
KIND_PATTERN = re.compile(r"^[a-z][a-z0-9_.-]*$")

# The names live in a module without numpy/h5py (the config checks them).
from hpcppo.rundir import metric_names as _names

STANDARD_COLUMNS = _names.STANDARD_COLUMNS
OPTIONAL_COLUMNS = _names.OPTIONAL_COLUMNS
VALIDATION_PREFIX = _names.VALIDATION_PREFIX
VALIDATION_ACC_PREFIX = _names.VALIDATION_ACC_PREFIX
trainer_columns = _names.trainer_columns
is_trainer_column = _names.is_trainer_column

#: Column dtype for strings stored as fixed-length UTF-8 (see module docstring for why not variable length).
COLUMN_NAME_BYTES = 256


class UnknownColumnError(HpcppoError, ValueError):
    """A metric name is not one of the declared columns; the message lists close matches."""

    def __init__(self, name: str, known: Iterable[str], *, where: str):
        known = list(known)
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else f"{len(known)} declared columns"
        super().__init__(f"{where}: unknown metric column {name!r}", hint=hint)
        self.name = name
        self.close_matches = close


def file_locking(locking: bool | None) -> dict[str, bool | str]:
    """``h5py.File`` keyword for file locking: ``locking`` if given, else what ``HDF5_USE_FILE_LOCKING`` says.

    HDF5 reads that variable once, when the library starts; reading it here too makes a value set later
    (by the CLI, or a test) count as well. Empty dict: the library default.
    """
    if locking is not None:
        return {"locking": bool(locking)}
    env = os.environ.get("HDF5_USE_FILE_LOCKING", "").strip().upper()
    if env in ("FALSE", "0"):
        return {"locking": False}
    if env in ("TRUE", "1"):
        return {"locking": True}
    if env == "BEST_EFFORT":
        return {"locking": "best-effort"}
    return {}


def check_columns(columns: Sequence[str]) -> tuple[str, ...]:
    """Validate declared metric names; returns them as a tuple. Raises ``ValueError`` naming the bad one."""
    if isinstance(columns, str):
        raise ValueError("columns must be a sequence of names, not a single string")
    out = tuple(columns)
    if not out:
        raise ValueError("at least one metric column must be declared")
    seen: set[str] = set()
    for name in out:
        if not isinstance(name, str) or not name or name != name.strip():
            raise ValueError(f"metric column name {name!r} must be a non-empty string without surrounding spaces")
        if "\x00" in name or len(name.encode()) > COLUMN_NAME_BYTES:
            raise ValueError(f"metric column name {name!r} contains NUL or is longer than {COLUMN_NAME_BYTES} bytes")
        if name in STRUCTURAL or name == "superseded":
            raise ValueError(f"metric column name {name!r} is reserved for a structural column")
        if name in seen:
            raise ValueError(f"metric column {name!r} is declared twice")
        seen.add(name)
    return out


def string_dtype(nbytes: int) -> np.dtype:
    """Fixed-length UTF-8 string dtype of ``nbytes`` bytes (safe under SWMR, unlike variable length)."""
    return h5py.string_dtype("utf-8", nbytes)


def encode_fixed(text: str, nbytes: int) -> bytes:
    """UTF-8 encode ``text``, truncated to ``nbytes`` at a character boundary (marked with an ellipsis)."""
    raw = text.encode("utf-8")
    if len(raw) <= nbytes:
        return raw
    ellipsis = "\u2026".encode()
    cut = raw[: nbytes - len(ellipsis)]
    return cut.decode("utf-8", errors="ignore").encode("utf-8") + ellipsis


def decode_fixed(raw: bytes) -> str:
    """Inverse of :func:`encode_fixed` (fixed-length strings come back NUL-padded or exact)."""
    return raw.rstrip(b"\x00").decode("utf-8", errors="replace")
