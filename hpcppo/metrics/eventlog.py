"""A run's events as one frame: the HDF5 log's events of every attempt and ``events.jsonl``, merged by time.

The two records overlap. The trainer writes each watchdog action, rollback, pause, preemption and resume into
its attempt's HDF5 file; watchdog actions and CLI requests also go to ``events.jsonl`` (with details such as
the rule, the value and the threshold), and the monitor beside the trainer writes only there (hangs, dead
trainers). An action the trainer recorded in both places is one row here (``source == "both"``): same kind,
same step, same attempt, the HDF5 message a prefix of the JSON one (the HDF5 log keeps 1,000 characters), and
logged within :data:`SAME_EVENT_S` of each other.

Attempt numbers: ``attempt`` is the number of the metric file (``NNNN`` of ``attempt-NNNN.h5``), in
:func:`hpcppo.metrics.load` and in ``events.jsonl`` alike. No torch.
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hpcppo.metrics.reader import load_events
from hpcppo.rundir.events import read_events
from hpcppo.rundir.paths import EVENTS, RunPaths, in_metrics_dir, is_metrics_dir

__all__ = ["EVENT_FRAME_COLUMNS", "SAME_EVENT_S", "events", "run_directory"]

#: Columns of :func:`events`, in order.
EVENT_FRAME_COLUMNS: tuple[str, ...] = ("time", "step", "attempt", "kind", "message", "source", "writer", "details")
#: An HDF5 event and a JSON record further apart than this are two events.
SAME_EVENT_S = 30.0
_JSON_FIELDS = ("time", "kind", "step", "attempt", "source", "message")


def run_directory(run: str | os.PathLike[str]) -> Path | None:
    """The run directory of ``run`` (a run directory, its ``metrics/`` directory, or a file in it), if any."""
    p = Path(run)
    if p.is_file():
        return p.parent.parent if in_metrics_dir(p) else None
    if is_metrics_dir(p) and not RunPaths(p).metrics.is_dir():
        return p.parent
    return p if p.is_dir() else None


def _unix(text: Any) -> float:
    try:
        when = _dt.datetime.fromisoformat(str(text))
    except ValueError:
        return float("nan")
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    return when.timestamp()


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _json_rows(run_dir: Path | None) -> list[dict[str, Any]]:
    if run_dir is None or not RunPaths(run_dir).events.is_file():
        return []
    rows = []
    for record in read_events(run_dir):
        attempt = _opt_int(record.get("attempt"))
        rows.append({
            "time": _unix(record.get("time")),
            "step": _opt_int(record.get("step")),
            "attempt": attempt,
            "kind": str(record.get("kind", "?")),
            "message": str(record.get("message", "")),
            "source": EVENTS,
            "writer": str(record.get("source", "")) or None,
            "details": {k: v for k, v in record.items() if k not in _JSON_FIELDS} or None,
        })
    return rows


def _same(h5: dict[str, Any], js: dict[str, Any]) -> bool:
    if h5["kind"] != js["kind"] or h5["step"] != js["step"]:
        return False
    if js["attempt"] is not None and h5["attempt"] != js["attempt"]:
        return False
    if not js["message"].startswith(h5["message"].rstrip("\u2026")):
        return False
    return abs(h5["time"] - js["time"]) <= SAME_EVENT_S


def events(run: str | os.PathLike[str], *, locking: bool | None = None) -> pd.DataFrame:
    """Every event of ``run``, from its HDF5 logs and its ``events.jsonl``, sorted by time.

    Columns (:data:`EVENT_FRAME_COLUMNS`): ``time`` (unix seconds, float), ``step`` and ``attempt`` (nullable
    ``Int64``: a CLI request has no step), ``kind`` (``watchdog.rollback``, ``resume``, ``paused``,
    ``preempted``, ``hang`` ...), ``message``, ``source`` (``"metrics"``: the HDF5 log only;
    ``"events.jsonl"``: the JSON log only; ``"both"``), ``writer`` (who wrote the JSON record: ``watchdog``,
    ``control``, ``monitor``, ``trainer``; ``None`` for the HDF5 log's own events) and ``details`` (the JSON
    record's other fields as a dict, or ``None``).

    ``run`` is a run directory (both records), its ``metrics/`` directory or one metric file (its run's
    ``events.jsonl`` too when the file lies in ``<run>/metrics/``). Damaged HDF5 files are read as by
    :func:`hpcppo.metrics.load`; ``attrs["damaged"]`` lists them. A torn line of ``events.jsonl`` is skipped
    with a warning.

    Raises:
        PathError: ``run`` does not exist, or a metric file cannot be opened and is not a truncated log.
    """
    h5 = load_events(run, locking=locking)
    rows = [{"time": float(t), "step": int(s), "attempt": int(a), "kind": k, "message": m, "source": "metrics",
             "writer": None, "details": None}
            for t, s, a, k, m in zip(h5["time"], h5["step"], h5["attempt"], h5["kind"], h5["message"])]
    unmatched: dict[tuple[str, int], list[int]] = {}  # (kind, step) -> HDF5 rows not matched yet
    for i, row in enumerate(rows):
        unmatched.setdefault((row["kind"], row["step"]), []).append(i)
    for js in _json_rows(run_directory(run)):
        candidates = unmatched.get((js["kind"], js["step"]), [])
        match = next((i for i in candidates if _same(rows[i], js)), None)
        if match is None:
            rows.append(js)
            continue
        candidates.remove(match)
        # the JSON record has the whole message and the details; the HDF5 row keeps its own time
        rows[match].update(message=js["message"], source="both", writer=js["writer"], details=js["details"])
    dtypes = {"time": np.float64, "step": "Int64", "attempt": "Int64"}  # the rest: plain objects, None kept
    frame = pd.DataFrame({name: pd.Series([row[name] for row in rows], dtype=dtypes.get(name, object))
                          for name in EVENT_FRAME_COLUMNS})
    frame = frame.sort_values(["time", "step"], kind="stable", ignore_index=True, na_position="last")
    frame.attrs["damaged"] = dict(h5.attrs.get("damaged", {}))
    return frame
