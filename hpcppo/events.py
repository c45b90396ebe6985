"""The run's audit log, ``runs/<id>/events.jsonl``: what the watchdog, the control inbox, the monitor beside the
trainer and the trainer itself did, one strict-JSON object per line. No torch, no h5py: the CLI reads it on a
login node, and the monitor writes it while the trainer owns the HDF5 log.

Appends are one ``os.write`` of one whole line on an ``O_APPEND`` descriptor, then ``fsync``. On a local
filesystem POSIX makes each such write land at the end of the file whole, so concurrent appenders (rank 0 and the
monitor) interleave lines, never bytes. NFS does not implement ``O_APPEND`` atomically (the client computes the
offset), so two hosts appending at the same instant could overwrite each other's line; the writers here are rank 0
and the monitor on the batch host, which rarely write within the same millisecond, and a reader skips a line it
cannot parse instead of failing (as it does for the torn last line of a writer killed mid-write).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["EVENTS_FILE", "SOURCES", "append_event", "read_events"]

EVENTS_FILE = "events.jsonl"
SOURCES = ("watchdog", "control", "monitor", "trainer")


def _plain(value: Any) -> Any:
    """Strict JSON: non-finite floats become the strings "nan", "inf", "-inf"; tuples become lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def append_event(run_dir: str | os.PathLike[str], *, kind: str, step: int | None, source: str, message: str = "",
                 attempt: int | None = None, **details: Any) -> dict[str, Any]:
    """Append one event and return the record written (``time`` is ISO 8601 UTC)."""
    if source not in SOURCES:
        raise ValueError(f"event source {source!r} is not one of {', '.join(SOURCES)}")
    record = {"time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"), "kind": str(kind),
              "step": None if step is None else int(step), "source": source, "attempt": attempt,
              "message": str(message)}
    record |= {k: _plain(v) for k, v in details.items() if k not in record}
    line = (json.dumps(record, allow_nan=False, separators=(",", ":"), default=str) + "\n").encode()
    path = Path(run_dir) / EVENTS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    return record


def read_events(run_dir: str | os.PathLike[str], *, kinds: Iterable[str] | None = None,
                last: int | None = None) -> list[dict[str, Any]]:
    """The events in file order (optionally only ``kinds``, only the ``last`` N); a missing file is no events, a
    line that does not parse (a writer killed mid-line) is skipped."""
    path = Path(run_dir) / EVENTS_FILE
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    wanted = set(kinds) if kinds is not None else None
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and (wanted is None or record.get("kind") in wanted):
            out.append(record)
    return out[-last:] if last else out
