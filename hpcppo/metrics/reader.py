"""Read a run's metric logs into pandas, while the job writes them or after it died.

Files are opened in SWMR read mode, which works on a file still open for writing, on a closed file, and on
a file whose writer was killed (a SWMR file needs no repair). Rows are read up to the shortest dataset (the
writer resizes one dataset after another) and rows whose ``seq`` still reads as the fill value are dropped.

Which rows are current: rows are ordered by (attempt, seq), the order in which they were logged. A row is
*superseded* when a later row has a step not after its own: a rollback or a resumed attempt restarts from an
earlier step, which abandons everything the old branch logged from that step on. For a step logged again
this is "the latest (attempt, seq) wins"; it also drops the abandoned branch's steps that the new branch has
not reached yet, so the default view is always one consistent history whose steps strictly increase.
``load(run, attempts="all", branches="all")`` keeps every row and says which are current.

Speed: the structural columns are read first; once they say which rows are wanted, HDF5 reads each file's
metric values straight into their place in one float64 array (one read per run of consecutive rows), which
becomes the frame's block without a copy: the values are touched once, as by a plain ``h5py`` read
(``tools/bench_metrics.py``: 1,000,000 rows x 45 columns in ~1.3x a plain read of the same datasets).

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
from hpcppo.rundir.paths import RunPaths, attempt_files_in, in_metrics_dir, is_metrics_dir

log = logging.getLogger(__name__)

ROW_COLUMNS: tuple[str, ...] = ("step", "attempt", "branch", "seq", "time")
EVENT_COLUMNS: tuple[str, ...] = ("attempt", "step", "time", "kind", "message")
_EVENT_DATASETS: tuple[str, ...] = ("step", "time", "kind", "message")
_REREAD_S = 0.1  # pause before a read that met damage is tried again


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
    d = RunPaths(p).metrics if RunPaths(p).metrics.is_dir() else p
    return [f for f in attempt_files_in(d).values() if f.is_file()]


class _FileRead(NamedTuple):
    attrs: dict[str, Any]  # the root attributes asked for (empty when unreadable)
    arrays: dict[str, np.ndarray]  # the intact rows of each dataset, all of one length (empty: none)
    damage: str | None  # what was lost, None for a whole file
    present: tuple[str, ...] = ()  # the datasets of ``unread`` the file has (a file older than one has not)


def _committed_length(datasets: Sequence[h5py.Dataset]) -> int:
    """Rows present in every dataset: the writer resizes datasets one after another during an append."""
    for d in datasets:
        d.refresh()
    return min(d.shape[0] for d in datasets)


def _has_hdf5_signature(path: Path) -> bool:
    """The HDF5 signature where the library looks for it: at byte 0, 512, 1024, 2048 ... (after a user block).
    True when the file cannot be read at all (then h5py's own message says more)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            offset = 0
            while offset + 8 <= size:
                f.seek(offset)
                if f.read(8) == b"\x89HDF\r\n\x1a\n":
                    return True
                offset = 512 if offset == 0 else 2 * offset
    except OSError:
        return True
    return False


def _read_once(path: Path, locking: bool | None, names: Sequence[str], attr_names: Sequence[str],
               unread: Sequence[str] = ()) -> _FileRead:
    try:
        f = h5io.open_swmr(path, locking)
    except OSError as e:
        if not _has_hdf5_signature(path):
            raise PathError(f"{path}: cannot open the metric log: not an HDF5 file (no HDF5 signature)") from e
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
            present = tuple(name for name in unread if name in f)
            datasets = [f[name] for name in [*names, *present]]
            n = _committed_length(datasets)
            kept = min(h5io.intact_rows(d, n, path) for d in datasets)
            arrays = {name: d[:kept] for name, d in zip(names, datasets)}
        except h5io.HDF5_ERRORS as e:
            return _FileRead(meta, {}, f"no row can be read ({h5io.describe(path, e)})")
    if kept == n:
        return _FileRead(meta, arrays, None, present)
    cut = h5io.truncation(path)
    return _FileRead(meta, arrays, f"{kept} of its {n} rows kept, the others are lost"
                                   + (f" (truncated: {cut})" if cut else ""), present)


def _read_file(path: Path, locking: bool | None, names: Sequence[str], attr_names: Sequence[str],
               unread: Sequence[str] = ()) -> _FileRead:
    """The intact rows of datasets ``names`` and root attributes ``attr_names`` of one metric log; the datasets
    ``unread`` only bound which rows are intact (their data is read later, straight into its place)."""
    read = _read_once(path, locking, names, attr_names, unread)
    if read.damage is not None:  # or a writer was rewriting a block of metadata just then: look once more
        time.sleep(_REREAD_S)
        read = _read_once(path, locking, names, attr_names, unread)
    return read


def damage_line(path: str | os.PathLike[str], what: str) -> str:
    """The one line every reader says about a damaged file: what was lost, and what of the file is shown."""
    shown = "nothing of it is shown" if what.startswith(("0 of", "no row")) else "shown: its intact rows"
    return f"{path}: damaged metric log: {what}; {shown}"


def _marked(frame: pd.DataFrame, damaged: dict[str, str]) -> pd.DataFrame:
    """``frame`` with ``attrs["damaged"]``; one warning per damaged file (the CLI prints it as an error line and
    exits with PathError's code, whichever command read the file)."""
    for path, what in damaged.items():
        log.warning("%s", damage_line(path, what))
    frame.attrs["damaged"] = dict(damaged)
    return frame


class _Rows(NamedTuple):
    """The complete rows of one file: structural columns now, metric values later (:func:`_read_values`), once
    it is known which rows are wanted and where they go."""

    path: Path
    columns: list[str]  # the file's metric names, in ``values`` column order
    structural: dict[str, np.ndarray]  # ROW_COLUMNS -> (n,), the complete rows only
    dataset_index: np.ndarray | None  # the dataset row of each complete row (None: rows 0 .. n-1)
    damage: str | None
    has_logged: bool = False  # the file has ``/logged`` (which cells a row logged); older files have not


def _read_rows(path: Path, locking: bool | None) -> _Rows:
    read = _read_file(path, locking, list(schema.STRUCTURAL), ["columns"], unread=[schema.VALUES, schema.LOGGED])
    columns = [schema.decode_fixed(c) for c in read.attrs.get("columns", [])]
    has_logged = schema.LOGGED in read.present
    if not read.arrays:
        empty: dict[str, np.ndarray] = {name: np.zeros(0, dtype) for name, (dtype, _) in schema.STRUCTURAL.items()}
        return _Rows(path, columns, empty, None, read.damage, has_logged)
    arrays = read.arrays
    # A structural value still at its fill value means the row is not complete yet (seq is written last,
    # but the order in which HDF5 writes chunks of different datasets to disk is not ours to choose).
    written = (arrays["seq"] >= 0) & (arrays["step"] >= 0) & (arrays["attempt"] >= 0) & (arrays["branch"] >= 0)
    written &= ~np.isnan(arrays["time"])
    if written.all():  # the usual case
        return _Rows(path, columns, {name: arrays[name] for name in ROW_COLUMNS}, None, read.damage, has_logged)
    return _Rows(path, columns, {name: arrays[name][written] for name in ROW_COLUMNS}, np.flatnonzero(written),
                 read.damage, has_logged)


def _runs(rows: np.ndarray) -> list[tuple[int, int, int]]:
    """``(first, stop, position)`` of each run of consecutive numbers in the sorted ``rows``."""
    if rows.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = np.r_[0, breaks]
    stops = np.r_[breaks, rows.size]
    return [(int(rows[a]), int(rows[b - 1]) + 1, int(a)) for a, b in zip(starts, stops)]


def _read_values(r: _Rows, locking: bool | None, select: np.ndarray | None, out: np.ndarray,
                 where: dict[str, int], dataset: str = schema.VALUES) -> None:
    """Read the values (or ``dataset``: ``/logged``) of ``r``'s complete rows ``select`` (sorted positions; None:
    all) into ``out``, row for row, each column into ``out``'s column ``where[name]``. HDF5 writes straight into
    ``out`` (no copy), one read per run of consecutive rows (a rollback or a resume makes a few)."""
    n = len(r.structural["step"])
    positions = np.arange(n) if select is None else select
    dataset_rows = positions if r.dataset_index is None else r.dataset_index[positions]
    pairs = [(i, where[c]) for i, c in enumerate(r.columns) if c in where]
    if not pairs or not len(dataset_rows):
        return
    i0, j0 = pairs[0]
    block = all(i - i0 == j - j0 == k for k, (i, j) in enumerate(pairs))  # file columns i0.. land at j0..
    try:
        with h5io.open_swmr(r.path, locking) as f:
            ds = f[dataset]
            for first, stop, at in _runs(dataset_rows):
                if block:
                    ds.read_direct(out, np.s_[first:stop, i0:i0 + len(pairs)], np.s_[at:at + stop - first, j0:j0 + len(pairs)])
                else:
                    part = ds[first:stop]
                    for i, j in pairs:
                        out[at:at + stop - first, j] = part[:, i]
    except h5io.HDF5_ERRORS as e:  # its rows were intact a moment ago: the file changed under us
        raise PathError(f"{r.path}: the metric log changed while it was read ({h5io.describe(r.path, e)})",
                        hint="read it again") from e


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


def _history_masks(steps: np.ndarray, attempts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(redone_later, abandoned_within)`` for rows ordered by (attempt, seq).

    ``redone_later``: a later attempt logged a step at or before this row's (the attempt resumed from an
    earlier checkpoint). ``abandoned_within``: a later row of the same attempt did (a rollback). A row is
    superseded (:func:`superseded_mask`) exactly when one of the two holds.
    """
    n = steps.size
    if n == 0:
        return np.zeros(0, bool), np.zeros(0, bool)
    starts = np.flatnonzero(np.r_[True, attempts[1:] != attempts[:-1]])
    group = np.cumsum(np.r_[False, attempts[1:] != attempts[:-1]])
    # Within an attempt: a later attempt's steps are lifted above every earlier one's, so the running minimum
    # of successors never reaches across attempts.
    abandoned_within = superseded_mask(steps + group.astype(np.int64) * (np.int64(1) << 40))
    first_of_later = np.minimum.accumulate(np.minimum.reduceat(steps, starts)[::-1])[::-1]  # min over groups >= g
    later = np.append(first_of_later[1:], np.iinfo(np.int64).max)  # min over groups > g
    redone_later = steps >= later[group]
    return redone_later, abandoned_within


_ATTEMPTS = ("latest", "all")
_BRANCHES = ("current", "all")


def _frame(structural: dict[str, np.ndarray], values: np.ndarray, columns: Sequence[str]) -> pd.DataFrame:
    """Structural columns, then the metric columns as one float block (a view of ``values``: no copy)."""
    head = pd.DataFrame(structural)
    if not len(columns):
        return head
    # copy=False: the array is ours alone (read for this call); pandas would otherwise copy it into
    # column-major order, which costs more than reading the file.
    return pd.concat([head, pd.DataFrame(values, columns=list(columns), copy=False)], axis=1)


def load_with_logged(run: str | os.PathLike[str], **kwargs: Any) -> tuple[pd.DataFrame, np.ndarray]:
    """:func:`load` (same arguments), and which of the frame's metric cells were logged: an int8 array of shape
    (rows, metric columns), in the frame's row and metric-column order, 1 where the row logged the metric (a
    NaN there is a real NaN), 0 where it did not (a NaN there means "not logged at this step"), -1 for every
    cell of a file written before the log recorded it (``/logged``, docs/metrics.md): there NaN means either.
    """
    return _load(run, with_logged=True, **kwargs)  # type: ignore[return-value]


def load(
    run: str | os.PathLike[str],
    *,
    attempts: str = "latest",
    branches: str = "current",
    columns: Sequence[str] | None = None,
    locking: bool | None = None,
    all_rows: bool = False,
) -> pd.DataFrame:
    """The metrics of ``run`` as a DataFrame; by default one row per step of the current history.

    Columns: ``step``, ``attempt``, ``branch``, ``seq``, ``time`` (unix seconds), then the metric columns
    under their original names (``actor/pg_loss``), in declaration order (columns first declared by a later
    attempt come after; an attempt that did not declare a column has NaN there). Rows are in logging order,
    (attempt, seq).

    Which rows. The current history is the latest row of each step, minus the steps an abandoned branch
    logged that the current one has not reached yet (see the module docstring): its steps strictly increase.
    Other rows were left behind in one of two ways, and the two arguments keep them:

    * ``attempts="all"`` keeps the rows of an attempt that a later attempt logged again (it resumed from an
      earlier checkpoint, or a requeue re-did the steps after the last checkpoint); ``"latest"`` drops them.
    * ``branches="all"`` keeps the rows a rollback abandoned within an attempt; ``"current"`` drops them.

    ``attempts="all", branches="all"`` is every row of every file. Whenever either is ``"all"`` the frame
    has a boolean ``current`` column (last): the row is on the current history (the default view's rows).

    Args:
        run: run directory, its ``metrics/`` directory, or one metric file (see :func:`metric_files`).
        attempts: ``"latest"`` or ``"all"`` (above).
        branches: ``"current"`` or ``"all"`` (above).
        columns: only these metric columns (structural columns are always there).
        locking: HDF5 file locking (``False`` on NFS/Lustre); ``None`` honours ``HDF5_USE_FILE_LOCKING``.
        all_rows: the older spelling of every row: like ``attempts="all", branches="all"`` but with a
            ``superseded`` column (``~current``) instead of ``current``.

    Returns:
        The frame; ``frame.attrs["damaged"]`` maps each damaged file to what was lost (see the module
        docstring), empty when every file is whole. The metric columns share one float64 block read straight
        from the file (no per-column copy).

    Raises:
        PathError: ``run`` does not exist, or a file cannot be opened and is not a truncated metric log.
        UnknownColumnError: a name in ``columns`` is in none of the files.
        ValueError: ``attempts`` or ``branches`` is not one of the values above.
    """
    frame, _ = _load(run, attempts=attempts, branches=branches, columns=columns, locking=locking, all_rows=all_rows)
    return frame


def _load(run: str | os.PathLike[str], *, attempts: str = "latest", branches: str = "current",
          columns: Sequence[str] | None = None, locking: bool | None = None, all_rows: bool = False,
          with_logged: bool = False) -> tuple[pd.DataFrame, np.ndarray | None]:
    """:func:`load`, and with ``with_logged`` the logged cells (:func:`load_with_logged`)."""
    if attempts not in _ATTEMPTS:
        raise ValueError(f"attempts must be one of {', '.join(map(repr, _ATTEMPTS))}, not {attempts!r}")
    if branches not in _BRANCHES:
        raise ValueError(f"branches must be one of {', '.join(map(repr, _BRANCHES))}, not {branches!r}")
    if isinstance(columns, str):
        raise TypeError("columns must be a sequence of metric names, not a single string")
    declared: list[str] = []
    reads: list[_Rows] = []
    damaged: dict[str, str] = {}
    for path in metric_files(run):
        read = _read_rows(path, locking)
        declared.extend(c for c in read.columns if c not in declared)
        reads.append(read)
        if read.damage is not None:
            damaged[str(path)] = read.damage
    if columns is not None:
        for name in columns:
            if reads and name not in declared:
                raise UnknownColumnError(name, declared, where=str(run))
        declared = list(columns)
    reads = [r for r in reads if len(r.structural["step"])]
    extra = "superseded" if all_rows else "current" if (attempts, branches) != ("latest", "current") else None
    if not reads:
        df = _empty_rows(declared)
        if extra:
            df[extra] = pd.Series(dtype=bool)
        return _marked(df, damaged), (np.zeros((0, len(declared)), np.int8) if with_logged else None)
    structural, order = _combine(reads)
    keep, current = _select(structural, attempts="all" if all_rows else attempts,
                            branches="all" if all_rows else branches)
    rows = order if keep is None else keep if order is None else order[keep]
    if keep is not None:
        structural = {name: a[keep] for name, a in structural.items()}
        current = current[keep]
    values = _gather(reads, declared, rows, locking)
    logged = _gather(reads, declared, rows, locking, schema.LOGGED) if with_logged else None
    df = _frame(structural, values, declared)
    if extra == "superseded":
        df["superseded"] = ~current
    elif extra == "current":
        df["current"] = current
    return _marked(df, damaged), logged


def _combine(reads: Sequence[_Rows]) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """The files' structural columns as one set of arrays in (attempt, seq) order, and the permutation of the
    files' rows (taken one file after another) that sorts them (None: already in order, the usual case)."""
    if len(reads) == 1:
        structural = dict(reads[0].structural)
    else:
        structural = {name: np.concatenate([r.structural[name] for r in reads]) for name in ROW_COLUMNS}
    attempt, seq = structural["attempt"], structural["seq"]
    in_order = bool(np.all((attempt[1:] > attempt[:-1]) | ((attempt[1:] == attempt[:-1]) & (seq[1:] > seq[:-1]))))
    if in_order:
        return structural, None
    order = np.lexsort((seq, attempt))
    return {name: a[order] for name, a in structural.items()}, order


def _gather(reads: Sequence[_Rows], declared: Sequence[str], rows: np.ndarray | None,
            locking: bool | None, dataset: str = schema.VALUES) -> np.ndarray:
    """The metric values of ``rows`` (indices into the files' complete rows taken one file after another; None:
    all of them), in ``declared`` column order. Each file's values are read straight into their place in one
    new array: the values are touched once, as by a plain ``h5py`` read, whatever rows are dropped.

    ``dataset=LOGGED``: which cells were logged instead, as int8: 1 logged, 0 not (a column the file does not
    declare included), -1 unknown (every cell of a file written before ``/logged`` existed)."""
    if rows is not None and rows.size > 1 and not bool(np.all(rows[1:] > rows[:-1])):
        return _gather(reads, declared, None, locking, dataset)[rows]  # out of logging order across files: never so
    sizes = [len(r.structural["step"]) for r in reads]
    total = sum(sizes) if rows is None else int(rows.size)
    where = {name: j for j, name in enumerate(declared)}
    every_cell = all(set(declared) <= set(r.columns) for r in reads)
    out: np.ndarray
    if dataset == schema.LOGGED:  # read as stored (uint8: no conversion), returned as int8 (255 reads as -1)
        out = np.zeros((total, len(declared)), np.uint8)
    else:
        out = np.empty((total, len(declared))) if every_cell else np.full((total, len(declared)), np.nan)
    start = offset = 0
    for r, n in zip(reads, sizes):
        if rows is None:
            select, count = None, n
        else:
            lo, hi = np.searchsorted(rows, [offset, offset + n])
            select, count = rows[lo:hi] - offset, int(hi - lo)
        if dataset == schema.LOGGED and not r.has_logged:
            out[start:start + count] = 255
        else:
            _read_values(r, locking, select, out[start:start + count], where, dataset)
        start += count
        offset += n
    return out.view(np.int8) if dataset == schema.LOGGED else out


def _select(structural: dict[str, np.ndarray], *, attempts: str, branches: str) -> tuple[np.ndarray | None, np.ndarray]:
    """Rows to keep (None: all of them) and the ``current`` flag of every row."""
    redone_later, abandoned_within = _history_masks(structural["step"].astype(np.int64), structural["attempt"])
    current = ~(redone_later | abandoned_within)
    dropped = np.zeros_like(current)
    if attempts == "latest":
        dropped |= redone_later
    if branches == "current":
        dropped |= abandoned_within
    return (np.flatnonzero(~dropped) if dropped.any() else None), current


def _run_label(run: str | os.PathLike[str]) -> str:
    """A run's name for ``load_many``: its directory's name (``<run>/metrics/attempt-*.h5`` -> ``<run>``)."""
    p = Path(run).resolve()
    if p.is_file():
        p = p.parent.parent if in_metrics_dir(p) else p.with_suffix("")
    elif is_metrics_dir(p):
        p = p.parent
    return p.name


def load_many(
    runs: Sequence[str | os.PathLike[str]] | dict[str, str | os.PathLike[str]],
    **kwargs: Any,
) -> pd.DataFrame:
    """:func:`load` of several runs as one frame with a first column ``run``.

    Args:
        runs: run directories or metric files (labelled by the run directory's name; a name that two paths
            share is made unique with a ``#2``, ``#3`` ... suffix), or a ``{label: path}`` dict.
        **kwargs: passed to :func:`load` (``attempts``, ``branches``, ``columns``, ``locking``).

    Returns:
        Rows of each run in the order given; metric columns are the union (NaN where a run has none);
        ``attrs["damaged"]`` merges the runs' damaged files.
    """
    if isinstance(runs, (str, os.PathLike)):
        raise TypeError("runs must be a sequence of run paths (or a {label: path} dict), not a single path")
    labelled: list[tuple[str, Any]]
    if isinstance(runs, dict):
        labelled = [(str(k), v) for k, v in runs.items()]
    else:
        labelled = []
        seen: dict[str, int] = {}
        for run in runs:
            label = _run_label(run)
            seen[label] = seen.get(label, 0) + 1
            labelled.append((label if seen[label] == 1 else f"{label}#{seen[label]}", run))
    frames, damaged = [], {}
    for label, run in labelled:
        df = load(run, **kwargs)
        damaged.update(df.attrs.get("damaged", {}))
        df.insert(0, "run", pd.Series([label] * len(df), dtype=object, index=df.index))
        frames.append(df)
    if not frames:
        df = _empty_rows(kwargs.get("columns") or [])
        df.insert(0, "run", pd.Series(dtype=object))
    else:
        df = pd.concat(frames, ignore_index=True, sort=False)
    df.attrs["damaged"] = damaged
    return df


def load_events(run: str | os.PathLike[str], *, locking: bool | None = None) -> pd.DataFrame:
    """Events (rollback, kl_coef raised, pause, ...) of every attempt's HDF5 log, in logging order.

    :func:`hpcppo.metrics.events` merges these with ``events.jsonl`` (the monitor's and the CLI's records).

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
