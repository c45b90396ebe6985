"""``MetricsWriter``: the rank-0 HDF5 metric log of one attempt (layout in :mod:`hpcppo.metrics.schema`).

Every ``log`` appends one row and flushes, so a reader in another process sees it at once (SWMR) and a
``kill -9`` loses at most the row being written. A failed write or flush (EIO on a shared filesystem) never
raises into the training loop: the rows stay in memory and are written again, in full, on the next call.
"""

from __future__ import annotations

import logging
import operator
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import h5py
import numpy as np

from hpcppo.errors import RunStateError
from hpcppo.metrics import schema
from hpcppo.metrics.schema import UnknownColumnError
from hpcppo.rundir.paths import RunPaths

log = logging.getLogger(__name__)

# Errors an HDF5 write or flush can raise on I/O trouble: h5py maps HDF5's I/O errors to OSError and
# cache/flush failures to RuntimeError. Anything else (TypeError, ValueError) is a bug and propagates.
_IO_ERRORS = (OSError, RuntimeError)


def _resolve_path(run_dir_or_path: str | os.PathLike[str], attempt: int) -> Path:
    p = Path(run_dir_or_path)
    if p.suffix in (".h5", ".hdf5"):
        return p
    return RunPaths(p).attempt_file(attempt)


def _publish_no_clobber(tmp: Path, final: Path) -> None:
    """Make ``tmp`` appear as ``final`` atomically, failing if ``final`` exists (history is never replaced)."""
    try:
        os.link(tmp, final)
    except FileExistsError:
        raise
    except OSError:
        # Filesystems without hard links: a check-then-rename; the window is tiny and there is one writer.
        if final.exists():
            raise FileExistsError(str(final)) from None
        os.rename(tmp, final)
        return
    os.unlink(tmp)


class MetricsWriter:
    """Append-only metric log of one attempt, written by global rank 0 only.

    Args:
        run_dir_or_path: a run directory (the file is ``<run>/metrics/attempt-NNNN.h5``) or a ``.h5`` path.
        columns: metric names (``schema.STANDARD_COLUMNS`` plus the trainer's own), fixed for the file.
        attempt: attempt number; each attempt writes a new file and never touches an older one.
        swmr: switch SWMR on so other processes can read while the job writes (needs POSIX write
            ordering; without it the file is readable only after ``close``).
        locking: HDF5 file locking; ``False`` for NFS/GPFS/Lustre sites where locks fail. ``None`` leaves
            the library default, which honours ``HDF5_USE_FILE_LOCKING``.
        chunk_rows: rows per HDF5 chunk.
    """

    def __init__(
        self,
        run_dir_or_path: str | os.PathLike[str],
        columns: Sequence[str],
        *,
        attempt: int,
        swmr: bool = True,
        locking: bool | None = None,
        chunk_rows: int = 64,
    ):
        self.columns: tuple[str, ...] = schema.check_columns(columns)
        self.attempt = operator.index(attempt)
        if self.attempt < 0:
            raise ValueError(f"attempt must be >= 0, got {attempt}")
        self.path = _resolve_path(run_dir_or_path, self.attempt)
        self.swmr = swmr
        self._index = {name: j for j, name in enumerate(self.columns)}
        self._branch = 0
        self._last_step: int | None = None
        self._next_seq = 0
        self._rows_on_disk = 0
        self._events_on_disk = 0
        # step, branch, seq, time, values, logged (1 where the row logged the column: a NaN there is a real NaN)
        self._pending_rows: list[tuple[int, int, int, float, np.ndarray, np.ndarray]] = []
        self._pending_events: list[tuple[int, float, bytes, bytes]] = []
        self._failures = 0
        self._closed = False
        if self.path.exists():
            raise RunStateError(
                f"{self.path}: the metric log of attempt {self.attempt} already exists",
                hint="a resumed or requeued run is a new attempt; earlier attempts' files are never rewritten",
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._file = self._create(self.path, chunk_rows, locking)
        except FileExistsError:
            raise RunStateError(
                f"{self.path}: the metric log of attempt {self.attempt} was created by another writer",
                hint="only global rank 0 writes metrics, once per attempt",
            ) from None

    # -- creation -------------------------------------------------------------------------------------

    def _create(self, final: Path, chunk_rows: int, locking: bool | None) -> h5py.File:
        """Create the whole schema in a temporary file, switch SWMR on, then publish it under its name.

        A reader globbing ``metrics/`` therefore never meets a half-created file, nor one that is not yet
        in SWMR mode (which it could not open while the writer holds it).
        """
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        kwargs = schema.file_locking(locking)
        f = h5py.File(tmp, "w", libver="latest", **kwargs)
        try:
            f.attrs["format"] = schema.FORMAT
            f.attrs["format_version"] = schema.FORMAT_VERSION
            f.attrs["attempt"] = self.attempt
            # The job attempt that writes it ($HPCPPO_ATTEMPT, as the launchers export it): the watchdog monitor of
            # another attempt must never take this file for its own.
            f.attrs["job_attempt"] = os.environ.get("HPCPPO_ATTEMPT", "")
            f.attrs["created_unix"] = time.time()
            f.attrs.create(
                "columns",
                data=[c.encode() for c in self.columns],
                dtype=schema.string_dtype(schema.COLUMN_NAME_BYTES),
            )
            ds: dict[str, h5py.Dataset] = {}
            for name, (dtype, fill) in schema.STRUCTURAL.items():
                ds[name] = f.create_dataset(
                    name, shape=(0,), maxshape=(None,), chunks=(chunk_rows * 4,), dtype=dtype, fillvalue=fill
                )
            ncols = len(self.columns)
            ds[schema.VALUES] = f.create_dataset(
                schema.VALUES,
                shape=(0, ncols),
                maxshape=(None, ncols),
                chunks=(chunk_rows, ncols),
                dtype=np.float64,
                fillvalue=np.nan,
            )
            ds[schema.LOGGED] = f.create_dataset(
                schema.LOGGED,
                shape=(0, ncols),
                maxshape=(None, ncols),
                chunks=(chunk_rows * 8, ncols),  # the bytes of a chunk of values: as few chunks to read
                dtype=np.uint8,
                fillvalue=0,
            )
            ev = f.create_group(schema.EVENTS)
            ev_ds = {
                "step": ev.create_dataset("step", (0,), maxshape=(None,), chunks=(64,), dtype=np.int64, fillvalue=-1),
                "time": ev.create_dataset(
                    "time", (0,), maxshape=(None,), chunks=(64,), dtype=np.float64, fillvalue=np.nan
                ),
                "kind": ev.create_dataset(
                    "kind", (0,), maxshape=(None,), chunks=(64,), dtype=schema.string_dtype(schema.KIND_BYTES)
                ),
                "message": ev.create_dataset(
                    "message", (0,), maxshape=(None,), chunks=(16,), dtype=schema.string_dtype(schema.MESSAGE_BYTES)
                ),
            }
            if self.swmr:
                f.swmr_mode = True  # from here on no object or attribute may be created
            f.flush()
            _publish_no_clobber(tmp, final)
        except BaseException:
            f.close()
            tmp.unlink(missing_ok=True)
            raise
        self._ds = ds
        self._ev = ev_ds
        return f

    # -- appending ------------------------------------------------------------------------------------

    @property
    def branch(self) -> int:
        """Current branch: bumped whenever a step not after the previous one is logged (a rollback)."""
        return self._branch

    @property
    def rows_written(self) -> int:
        """Rows written and flushed (visible to readers)."""
        return self._rows_on_disk

    @property
    def rows_pending(self) -> int:
        """Rows kept in memory after a failed write, to be written on the next call."""
        return len(self._pending_rows)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """Append the row of ``step``; omitted columns are NaN and marked not logged (``/logged`` 0), a value
        given as NaN is marked logged: a reader tells a real NaN from a metric not logged at this step. Call
        once per step with all its metrics.

        A step that is not greater than the previous one starts a new branch (a rollback re-logs steps);
        earlier rows are kept and readers mark them superseded.

        Raises:
            UnknownColumnError: a key is not a declared column (the message lists close matches).
            TypeError: a value is not convertible to float.
        """
        self._check_open()
        step = self._check_step(step)
        row = np.full(len(self.columns), np.nan)
        logged = np.zeros(len(self.columns), np.uint8)
        for key, value in values.items():
            j = self._index.get(key)
            if j is None:
                raise UnknownColumnError(key, self.columns, where=str(self.path))
            try:
                row[j] = float(value)
            except (TypeError, ValueError) as e:
                raise TypeError(f"{self.path}: metric {key!r} has a non-numeric value {value!r}") from e
            logged[j] = 1
        if self._last_step is not None and step <= self._last_step:
            self._branch += 1
        self._last_step = step
        self._pending_rows.append((step, self._branch, self._next_seq, time.time(), row, logged))
        self._next_seq += 1
        self._drain()

    def log_event(self, step: int, kind: str, message: str = "") -> None:
        """Record an event (rollback, kl_coef raised, pause, critic restart...) at ``step``.

        ``kind`` is a short lowercase identifier (``[a-z][a-z0-9_.-]*``, at most 64 bytes); ``message`` is
        free text, truncated to 1024 bytes.
        """
        self._check_open()
        step = self._check_step(step)
        if not isinstance(kind, str) or not schema.KIND_PATTERN.match(kind) or len(kind) > schema.KIND_BYTES:
            raise ValueError(
                f"event kind {kind!r} must match {schema.KIND_PATTERN.pattern} and be at most {schema.KIND_BYTES} bytes"
            )
        if not isinstance(message, str):
            raise TypeError(f"event message must be a str, got {type(message).__name__}")
        self._pending_events.append(
            (step, time.time(), kind.encode(), schema.encode_fixed(message, schema.MESSAGE_BYTES))
        )
        self._drain()

    def _check_step(self, step: int) -> int:
        if isinstance(step, bool):
            raise TypeError("step must be an int, not a bool")
        step = operator.index(step)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return step

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.path}: metrics writer is closed")

    def _drain(self) -> bool:
        """Write every pending row and event, then flush; on I/O failure keep them for the next call.

        Each try rewrites the whole pending slice ``[on_disk, on_disk + pending)`` of every dataset, so a try
        that failed halfway (some datasets resized, others not) is simply overwritten: retries are idempotent.
        """
        if not self._pending_rows and not self._pending_events:
            return True
        try:
            if self._pending_rows:
                start = self._rows_on_disk
                stop = start + len(self._pending_rows)
                steps, branches, seqs, times, rows, logged = zip(*self._pending_rows)
                data = {
                    "step": np.asarray(steps, np.int64),
                    "attempt": np.full(len(steps), self.attempt, np.int32),
                    "branch": np.asarray(branches, np.int64),
                    "time": np.asarray(times, np.float64),
                    schema.VALUES: np.stack(rows),
                    schema.LOGGED: np.stack(logged),
                    # seq last: a reader treats a row whose seq still reads as the fill value as not written
                    "seq": np.asarray(seqs, np.int64),
                }
                for name, arr in data.items():
                    ds = self._ds[name]
                    ds.resize(stop, axis=0)
                    ds[start:stop] = arr
            if self._pending_events:
                start = self._events_on_disk
                stop = start + len(self._pending_events)
                steps, times, kinds, messages = zip(*self._pending_events)
                for name, arr in (
                    ("step", np.asarray(steps, np.int64)),
                    ("kind", np.array(kinds, dtype=schema.string_dtype(schema.KIND_BYTES))),
                    ("message", np.array(messages, dtype=schema.string_dtype(schema.MESSAGE_BYTES))),
                    ("time", np.asarray(times, np.float64)),  # last: the commit mark of an event
                ):
                    ds = self._ev[name]
                    ds.resize(stop, axis=0)
                    ds[start:stop] = arr
            self._file.flush()
        except _IO_ERRORS as e:
            self._failures += 1
            # First failure of a streak and then every 100th: a dead filesystem must not flood the log.
            if self._failures == 1 or self._failures % 100 == 0:
                log.warning(
                    "%s: writing metrics failed (%s: %s); keeping %d rows and %d events in memory, retrying on "
                    "the next log (failure %d in a row)",
                    self.path,
                    type(e).__name__,
                    e,
                    len(self._pending_rows),
                    len(self._pending_events),
                    self._failures,
                )
            return False
        if self._failures:
            log.warning("%s: writing metrics recovered after %d failed tries", self.path, self._failures)
            self._failures = 0
        self._rows_on_disk += len(self._pending_rows)
        self._events_on_disk += len(self._pending_events)
        self._pending_rows.clear()
        self._pending_events.clear()
        return True

    # -- durability and lifetime ------------------------------------------------------------------------

    def fsync(self) -> bool:
        """Flush to the OS, then ``fsync`` the file to stable storage (call at checkpoints).

        ``flush`` alone reaches the page cache only. The descriptor comes from HDF5's own file driver
        (``get_vfd_handle``), so the sync covers exactly the bytes HDF5 wrote. Returns ``False`` (with a
        warning) if the data could not be written or synced; never raises on I/O errors.
        """
        self._check_open()
        if not self._drain():
            return False
        try:
            fd = self._file.id.get_vfd_handle()
            os.fsync(fd)
        except _IO_ERRORS + (ValueError,) as e:
            log.warning("%s: fsync of the metric log failed (%s: %s)", self.path, type(e).__name__, e)
            return False
        return True

    def close(self) -> None:
        """Write what is pending, fsync and close. Idempotent; rows that still cannot be written are reported."""
        if self._closed:
            return
        self.fsync()
        lost_rows, lost_events = len(self._pending_rows), len(self._pending_events)
        if lost_rows or lost_events:
            log.error(
                "%s: closing with %d rows and %d events that could not be written", self.path, lost_rows, lost_events
            )
        self._closed = True
        try:
            self._file.close()
        except _IO_ERRORS as e:
            log.error("%s: closing the metric log failed (%s: %s)", self.path, type(e).__name__, e)

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MetricsWriter({str(self.path)!r}, {len(self.columns)} columns, attempt={self.attempt})"
