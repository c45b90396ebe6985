"""Read a run's metric logs into pandas, while the job writes them or after it died.

Files are opened in SWMR read mode, which works on a file still open for writing, on a closed file, and on
a file whose writer was killed (a SWMR file needs no repair). Rows are read up to the shortest dataset (the
writer resizes one dataset after another) and rows whose ``seq`` still reads as the fill value are dropped.

Which rows are current: rows are ordered by (attempt, seq), the order in which they were logged. A row is
*superseded* when a later row has a step not after its own: a rollback or a resumed attempt restarts from an
earlier step, which abandons everything the old branch logged from that step on. For a step logged again
this is "the latest (attempt, seq) wins"; it also drops the abandoned branch's steps that the new branch has
not reached yet, so the default view is always one consistent history whose steps strictly increase.

Damaged files. A file truncated by a full disk, a quota or an interrupted copy is read within seconds, never
hangs (:mod:`hpcppo.metrics.h5io`), and gives the rows that are provably intact: a file's rows stop at the
first one whose bytes, or whose entry in a chunk index, are not all in the file; a file whose other metadata
(root attributes, dataset headers) cannot be read gives none. The frame says so in ``frame.attrs["damaged"]``
(``{file: what was lost}``, empty when every file is whole), and each damaged file is reported by one
warning on the ``hpcppo.metrics.reader`` logger. A read that meets damage is tried once more after a short
pause, so that a writer rewriting a block of metadata at that moment is not taken for damage. A file that
cannot be opened at all and is not recognizably truncated (not HDF5, not a metric log, locked) is an error
(:class:`~hpcppo.errors.PathError`).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import h5py
import numpy as np
import pandas as pd

from hpcppo.errors import PathError
from hpcppo.metrics import h5io, schema
from hpcppo.metrics.schema import UnknownColumnError

log = logging.getLogger(__name__)

_ATTEMPT_FILE = re.compile(r"^attempt-(\d+)\.h5$")
ROW_COLUMNS: tuple[str, ...] = ("step", "attempt", "branch", "seq", "time")
EVENT_COLUMNS: tuple[str, ...] = ("attempt", "step", "time", "kind", "message")
_EVENT_DATASETS: tuple[str, ...] = ("step", "time", "kind", "message")
_REREAD_S = 0.1  # pause before a read that met damage is tried again
_LOST_HINT = "what lies past the damage cannot be recovered; `h5clear` does not bring back missing bytes"


def metric_files(run: str | os.PathLike[str]) -> list[Path]:
    """The metric files of ``run`` in attempt order.

    ``run`` is a run directory (files in ``<run>/metrics/``), a directory holding ``attempt-*.h5`` files, or
    one ``.h5`` file. A run directory with no metric file yet gives an empty list.

    Raises:
        PathError: ``run`` does not exist.
    """
    p = Path(run)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise PathError(f"{p}: no such run directory or metrics file")
    d = p / "metrics" if (p / "metrics").is_dir() else p
    found = [(int(m.group(1)), f) for f in d.iterdir() if (m := _ATTEMPT_FILE.match(f.name)) and f.is_file()]
    return [f for _, f in sorted(found)]


class _FileRead(NamedTuple):
    attrs: dict[str, Any]  # the root attributes asked for (empty when unreadable)
    arrays: dict[str, np.ndarray]  # the intact rows of each dataset, all of one length (empty: none)
    damage: str | None  # what was lost, None for a whole file


def _committed_length(datasets: Sequence[h5py.Dataset]) -> int:
    """Rows present in every dataset: the writer resizes datasets one after another during an append."""
    for d in datasets:
        d.refresh()
    return min(d.shape[0] for d in datasets)


def _read_once(path: Path, locking: bool | None, names: Sequence[str], attr_names: Sequence[str]) -> _FileRead:
    try:
        f = h5io.open_swmr(path, locking)
    except OSError as e:
        if h5io.truncation(path) is None:
            raise PathError(
                f"{path}: cannot open the metric log ({e})",
                hint="on NFS/GPFS/Lustre pass locking=False or set HDF5_USE_FILE_LOCKING=FALSE; a file written "
                "without SWMR by a killed writer needs `h5clear -s FILE`",
            ) from e
        return _FileRead({}, {}, f"no row can be read ({h5io.describe(path, e)})")
    meta: dict[str, Any] = {}
    with f:
        try:
            fmt = f.attrs.get("format")
        except h5io.HDF5_ERRORS as e:
            return _FileRead(meta, {}, f"no row can be read ({h5io.describe(path, e)})")
        if fmt != schema.FORMAT:
            raise PathError(f"{path}: not an hpcppo metric log (no format={schema.FORMAT!r} attribute)")
        try:
            meta = {name: f.attrs[name] for name in attr_names}
            datasets = [f[name] for name in names]
            n = _committed_length(datasets)
            kept = min(h5io.intact_rows(d, n, path) for d in datasets)
            arrays = {name: d[:kept] for name, d in zip(names, datasets)}
        except h5io.HDF5_ERRORS as e:
            return _FileRead(meta, {}, f"no row can be read ({h5io.describe(path, e)})")
    if kept == n:
        return _FileRead(meta, arrays, None)
    cut = h5io.truncation(path)
    return _FileRead(meta, arrays, f"{kept} of its {n} rows kept, the others are lost"
                                   + (f" (truncated: {cut})" if cut else ""))


def _read_file(path: Path, locking: bool | None, names: Sequence[str], attr_names: Sequence[str]) -> _FileRead:
    """The intact rows of datasets ``names`` and root attributes ``attr_names`` of one metric log."""
    read = _read_once(path, locking, names, attr_names)
    if read.damage is not None:  # or a writer was rewriting a block of metadata just then: look once more
        time.sleep(_REREAD_S)
        read = _read_once(path, locking, names, attr_names)
    return read


def _marked(frame: pd.DataFrame, damaged: dict[str, str]) -> pd.DataFrame:
    """``frame`` with ``attrs["damaged"]``; one warning per damaged file."""
    for path, what in damaged.items():
        log.warning("%s: damaged metric log: %s (%s)", path, what, _LOST_HINT)
    frame.attrs["damaged"] = dict(damaged)
    return frame


def _read_rows(path: Path, locking: bool | None) -> tuple[list[str], pd.DataFrame, str | None]:
    names = [*schema.STRUCTURAL, schema.VALUES]
    read = _read_file(path, locking, names, ["columns"])
    columns = [schema.decode_fixed(c) for c in read.attrs.get("columns", [])]
    if not read.arrays:
        return columns, _empty_rows(columns), read.damage
    arrays = read.arrays
    # A structural value still at its fill value means the row is not complete yet (seq is written last,
    # but the order in which HDF5 writes chunks of different datasets to disk is not ours to choose).
    written = (arrays["seq"] >= 0) & (arrays["step"] >= 0) & (arrays["attempt"] >= 0) & (arrays["branch"] >= 0)
    written &= ~np.isnan(arrays["time"])
    data: dict[str, np.ndarray] = {name: arrays[name][written] for name in ROW_COLUMNS}
    values = arrays[schema.VALUES][written]
    for j, name in enumerate(columns):
        data[name] = values[:, j]
    return columns, pd.DataFrame(data), read.damage


def _empty_rows(metric_columns: Sequence[str]) -> pd.DataFrame:
    frame = {name: pd.Series(dtype=dtype) for name, (dtype, _) in schema.STRUCTURAL.items()}
    frame.update({name: pd.Series(dtype=np.float64) for name in metric_columns})
    return pd.DataFrame(frame)


def superseded_mask(steps: np.ndarray) -> np.ndarray:
    """For rows in logging order, ``True`` where a later row has a step ``<=`` this row's step.

    Args:
        steps: (N,) int, the step of each row, ordered by (attempt, seq).
    Returns:
        (N,) bool.
    """
    steps = np.asarray(steps, dtype=np.int64)
    if steps.size == 0:
        return np.zeros(0, dtype=bool)
    # min over each row's successors: a reversed running minimum, shifted by one
    suffix_min = np.minimum.accumulate(steps[::-1])[::-1]
    later_min = np.append(suffix_min[1:], np.iinfo(np.int64).max)
    return steps >= later_min


def load(
    run: str | os.PathLike[str],
    *,
    all_rows: bool = False,
    columns: Sequence[str] | None = None,
    locking: bool | None = None,
) -> pd.DataFrame:
    """The metrics of ``run`` as a DataFrame, one row per step of the current history.

    Columns: ``step``, ``attempt``, ``branch``, ``seq``, ``time`` (unix seconds), then the metric columns
    under their original names (``actor/pg_loss``), in declaration order (columns first declared by a later
    attempt come after; an attempt that did not declare a column has NaN there).

    Args:
        run: run directory, its ``metrics/`` directory, or one metric file (see :func:`metric_files`).
        all_rows: keep superseded rows (abandoned branches, earlier attempts' re-done steps) too, ordered by
            (attempt, seq), with a boolean ``superseded`` column.
        columns: only these metric columns (structural columns are always there).
        locking: HDF5 file locking (``False`` on NFS/Lustre); ``None`` honours ``HDF5_USE_FILE_LOCKING``.

    Returns:
        The frame; ``frame.attrs["damaged"]`` maps each damaged file to what was lost (see the module
        docstring), empty when every file is whole.

    Raises:
        PathError: ``run`` does not exist, or a file cannot be opened and is not a truncated metric log.
        UnknownColumnError: a name in ``columns`` is in none of the files.
    """
    declared: list[str] = []
    frames: list[pd.DataFrame] = []
    damaged: dict[str, str] = {}
    for path in metric_files(run):
        file_columns, frame, damage = _read_rows(path, locking)
        declared.extend(c for c in file_columns if c not in declared)
        frames.append(frame)
        if damage is not None:
            damaged[str(path)] = damage
    if columns is not None:
        if isinstance(columns, str):
            raise TypeError("columns must be a sequence of metric names, not a single string")
        for name in columns:
            if frames and name not in declared:
                raise UnknownColumnError(name, declared, where=str(run))
        declared = list(columns)
    order = [*ROW_COLUMNS, *declared]
    frames = [f for f in frames if len(f)]
    if not frames:
        df = _empty_rows(declared)
    else:
        df = pd.concat(frames, ignore_index=True, sort=False).reindex(columns=order)
        df = df.sort_values(["attempt", "seq"], kind="stable", ignore_index=True)
    superseded = superseded_mask(df["step"].to_numpy())
    if all_rows:
        df["superseded"] = superseded
        return _marked(df, damaged)
    return _marked(df.loc[~superseded].reset_index(drop=True), damaged)


def load_events(run: str | os.PathLike[str], *, locking: bool | None = None) -> pd.DataFrame:
    """Events (rollback, kl_coef raised, pause, ...) of every attempt of ``run``, in logging order.

    Columns: ``attempt``, ``step``, ``time`` (unix seconds), ``kind``, ``message``. Damaged files are handled,
    and marked in ``attrs["damaged"]``, as by :func:`load`.
    """
    frames = []
    damaged: dict[str, str] = {}
    names = [f"{schema.EVENTS}/{name}" for name in _EVENT_DATASETS]
    for path in metric_files(run):
        read = _read_file(path, locking, names, ["attempt"])
        if read.damage is not None:
            damaged[str(path)] = read.damage
        if not read.arrays:
            continue
        step, when, kind, message = (read.arrays[name] for name in names)
        written = ~np.isnan(when)  # time is written last
        frames.append(
            pd.DataFrame(
                {
                    "attempt": np.full(int(written.sum()), int(read.attrs["attempt"]), np.int32),
                    "step": step[written],
                    "time": when[written],
                    "kind": [schema.decode_fixed(k) for k in kind[written]],
                    "message": [schema.decode_fixed(m) for m in message[written]],
                }
            )
        )
    frames = [f for f in frames if len(f)]
    if not frames:
        return _marked(
            pd.DataFrame(
                {
                    "attempt": pd.Series(dtype=np.int32),
                    "step": pd.Series(dtype=np.int64),
                    "time": pd.Series(dtype=np.float64),
                    "kind": pd.Series(dtype=object),
                    "message": pd.Series(dtype=object),
                }
            ),
            damaged,
        )
    return _marked(pd.concat(frames, ignore_index=True), damaged)
