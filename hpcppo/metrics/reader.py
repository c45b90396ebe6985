"""Read a run's metric logs into pandas, while the job writes them or after it died.

Files are opened in SWMR read mode, which works on a file still open for writing, on a closed file, and on
a file whose writer was killed (a SWMR file needs no repair). Rows are read up to the shortest dataset (the
writer resizes one dataset after another) and rows whose ``seq`` still reads as the fill value are dropped.

Which rows are current: rows are ordered by (attempt, seq), the order in which they were logged. A row is
*superseded* when a later row has a step not after its own: a rollback or a resumed attempt restarts from an
earlier step, which abandons everything the old branch logged from that step on. For a step logged again
this is "the latest (attempt, seq) wins"; it also drops the abandoned branch's steps that the new branch has
not reached yet, so the default view is always one consistent history whose steps strictly increase.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np
import pandas as pd

from hpcppo.errors import PathError
from hpcppo.metrics import schema
from hpcppo.metrics.schema import UnknownColumnError

_ATTEMPT_FILE = re.compile(r"^attempt-(\d+)\.h5$")
ROW_COLUMNS: tuple[str, ...] = ("step", "attempt", "branch", "seq", "time")
EVENT_COLUMNS: tuple[str, ...] = ("attempt", "step", "time", "kind", "message")


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


def _open(path: Path, locking: bool | None) -> h5py.File:
    kwargs = schema.file_locking(locking)
    try:
        f = h5py.File(path, "r", swmr=True, **kwargs)
    except OSError as e:
        raise PathError(
            f"{path}: cannot open the metric log ({e})",
            hint="on NFS/GPFS/Lustre pass locking=False or set HDF5_USE_FILE_LOCKING=FALSE; a file written "
            "without SWMR by a killed writer needs `h5clear -s FILE`",
        ) from e
    if f.attrs.get("format") != schema.FORMAT:
        f.close()
        raise PathError(f"{path}: not an hpcppo metric log (no format={schema.FORMAT!r} attribute)")
    return f


def _committed_length(datasets: Sequence[h5py.Dataset]) -> int:
    """Rows present in every dataset: the writer resizes datasets one after another during an append."""
    for d in datasets:
        d.refresh()
    return min(d.shape[0] for d in datasets)


def _read_rows(path: Path, locking: bool | None) -> tuple[list[str], pd.DataFrame]:
    with _open(path, locking) as f:
        columns = [schema.decode_fixed(c) for c in f.attrs["columns"]]
        names = [*schema.STRUCTURAL, schema.VALUES]
        n = _committed_length([f[name] for name in names])
        arrays = {name: f[name][:n] for name in names}
    # A structural value still at its fill value means the row is not complete yet (seq is written last,
    # but the order in which HDF5 writes chunks of different datasets to disk is not ours to choose).
    written = (arrays["seq"] >= 0) & (arrays["step"] >= 0) & (arrays["attempt"] >= 0) & (arrays["branch"] >= 0)
    written &= ~np.isnan(arrays["time"])
    data: dict[str, np.ndarray] = {name: arrays[name][written] for name in ROW_COLUMNS}
    values = arrays[schema.VALUES][written]
    for j, name in enumerate(columns):
        data[name] = values[:, j]
    return columns, pd.DataFrame(data)


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

    Raises:
        PathError: ``run`` does not exist, or a file is not a readable metric log.
        UnknownColumnError: a name in ``columns`` is in none of the files.
    """
    declared: list[str] = []
    frames: list[pd.DataFrame] = []
    for path in metric_files(run):
        file_columns, frame = _read_rows(path, locking)
        declared.extend(c for c in file_columns if c not in declared)
        frames.append(frame)
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
        return df
    return df.loc[~superseded].reset_index(drop=True)


def load_events(run: str | os.PathLike[str], *, locking: bool | None = None) -> pd.DataFrame:
    """Events (rollback, kl_coef raised, pause, ...) of every attempt of ``run``, in logging order.

    Columns: ``attempt``, ``step``, ``time`` (unix seconds), ``kind``, ``message``.
    """
    frames = []
    for path in metric_files(run):
        with _open(path, locking) as f:
            attempt = int(f.attrs["attempt"])
            ev = f[schema.EVENTS]
            names = ("step", "time", "kind", "message")
            n = _committed_length([ev[name] for name in names])
            arrays = {name: ev[name][:n] for name in names}
        written = ~np.isnan(arrays["time"])  # time is written last
        frames.append(
            pd.DataFrame(
                {
                    "attempt": np.full(int(written.sum()), attempt, np.int32),
                    "step": arrays["step"][written],
                    "time": arrays["time"][written],
                    "kind": [schema.decode_fixed(k) for k in arrays["kind"][written]],
                    "message": [schema.decode_fixed(m) for m in arrays["message"][written]],
                }
            )
        )
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(
            {
                "attempt": pd.Series(dtype=np.int32),
                "step": pd.Series(dtype=np.int64),
                "time": pd.Series(dtype=np.float64),
                "kind": pd.Series(dtype=object),
                "message": pd.Series(dtype=object),
            }
        )
    return pd.concat(frames, ignore_index=True)
