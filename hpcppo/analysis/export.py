"""``hpcppo metrics export``: a run's metric log as one Parquet or CSV file (pyarrow), written atomically. No torch.

The columns are those of :func:`hpcppo.metrics.load`: ``step``, ``attempt``, ``branch``, ``seq``, ``time``
(unix seconds), then the metrics under their own names (``actor/pg_loss``). By default the current history (one
row per step); ``all_attempts`` writes every row of every attempt, abandoned branches included, with a boolean
``current`` column. A Parquet file carries the run's name, the export's view and the damaged files (if any) as
schema metadata under ``hpcppo.*`` keys.

The file is written to a temporary file beside the target, fsynced and renamed over it
(:func:`hpcppo.fsutil.atomic_write`): a reader sees the old file or the whole new one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from hpcppo.analysis.targets import Target, damage_error, no_rows_error
from hpcppo.errors import ConfigError, PathError
from hpcppo.fsutil import atomic_write, require_output_dir, require_parent_dir
from hpcppo.metrics import load
from hpcppo.metrics.trackers import write_tensorboard
from hpcppo.rundir import RunPaths

FORMATS = ("parquet", "csv")  # and "tensorboard": export_tensorboard
EXPORT_SUFFIX = ".export"  # the end of the name of an exported TensorBoard event file
_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}


def export_format(out: Path, fmt: str | None) -> str:
    """``fmt``, or the one ``out``'s suffix names.

    Raises:
        ConfigError: neither says (or ``fmt`` is not one of :data:`FORMATS`).
    """
    if fmt is not None:
        if fmt not in FORMATS:
            raise ConfigError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
        return fmt
    found = _SUFFIXES.get(out.suffix.lower())
    if found is None:
        raise ConfigError(f"{out}: cannot tell the format from the suffix {out.suffix!r}",
                          hint="pass --format parquet or --format csv, or name the file .parquet / .csv")
    return found


def export_metrics(target: Target, out: str | os.PathLike[str], *, fmt: str | None = None,
                   all_attempts: bool = False, columns: Sequence[str] | None = None,
                   locking: bool | None = None) -> dict[str, Any]:
    """Write ``target``'s metrics to ``out``; returns what was written (rows, columns, format, path, damaged).

    Raises:
        ConfigError: an unknown format.
        RunStateError: no row to export (the message says why: a pending job, ...).
        UnknownColumnError: a name in ``columns`` is not a column of the log.
        PathError: ``out`` cannot be written (its parent directory must exist), or the log is unreadable.
    """
    import pyarrow as pa

    require_parent_dir(out, "-o")  # before the log is read: a typo in -o costs nothing
    out = Path(out)
    fmt = export_format(out, fmt)
    view: dict[str, Any] = ({"attempts": "all", "branches": "all"} if all_attempts
                            else {"attempts": "latest", "branches": "current"})
    frame = load(target.path, columns=columns, locking=locking, **view)
    if not len(frame):
        raise damage_error(target, frame.attrs["damaged"]) if frame.attrs.get("damaged") else no_rows_error(target)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    damaged = dict(frame.attrs.get("damaged", {}))
    meta = {"hpcppo.run": target.name, "hpcppo.view": json.dumps(view), "hpcppo.damaged": json.dumps(damaged)}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **{k: v.encode() for k, v in meta.items()}})

    def write(f: IO[bytes]) -> None:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, f)
        else:
            import pyarrow.csv as pacsv

            pacsv.write_csv(table, f)

    try:
        atomic_write(out, write)
    except OSError as e:
        raise PathError(f"{out}: cannot write the export ({e.strerror or e})") from e
    return {"run": target.name, "out": str(out), "format": fmt, "rows": int(len(frame)),
            "columns": int(frame.shape[1]), "view": view, "damaged": damaged}


def export_tensorboard(target: Target, out: str | os.PathLike[str] | None = None, *, all_attempts: bool = False,
                       columns: Sequence[str] | None = None, locking: bool | None = None) -> dict[str, Any]:
    """Write ``target``'s metrics as a TensorBoard event file in ``out`` (default: the run directory's
    ``tensorboard/``, where ``trainer.logger = ["tensorboard"]`` writes during training): one scalar per finite
    value, at its step and wall time (:func:`hpcppo.metrics.trackers.write_tensorboard`). ``all_attempts`` writes
    every row (a step re-logged after a rollback appears twice, as TensorBoard shows re-logged steps).

    Raises:
        ConfigError: the tensorboard package is not installed; ``out`` is not given for a metrics file outside a run.
        RunStateError: no row to export.
        PathError: ``out`` is not a directory that can be made and written.
    """
    given = out is not None
    if out is None:
        if target.run_dir is None:
            raise ConfigError(f"{target.path}: not in a run directory; pass -o DIR for the event files")
        out = RunPaths(target.run_dir).tensorboard
        if any(not p.name.endswith(EXPORT_SUFFIX) for p in out.glob("*tfevents*")):
            raise ConfigError(f"{out} holds the event files the trainer wrote (trainer.logger tensorboard): an "
                              f"export there would show each point twice", hint="pass -o DIR")
    require_output_dir(out, "-o" if given else "the run's tensorboard directory")  # before the log is read
    out = Path(out)
    view: dict[str, Any] = ({"attempts": "all", "branches": "all"} if all_attempts
                            else {"attempts": "latest", "branches": "current"})
    frame = load(target.path, columns=columns, locking=locking, **view)
    if not len(frame):
        raise damage_error(target, frame.attrs["damaged"]) if frame.attrs.get("damaged") else no_rows_error(target)
    # An export replaces the previous export in the same directory (TensorBoard would show both).
    replaced = [p for p in out.glob("*tfevents*") if p.name.endswith(EXPORT_SUFFIX)] if out.is_dir() else []
    written = write_tensorboard(frame, out, suffix=EXPORT_SUFFIX)
    for p in replaced:
        p.unlink()
    return {"run": target.name, "out": str(out), "format": "tensorboard", "view": view,
            "damaged": dict(frame.attrs.get("damaged", {})), **written}
