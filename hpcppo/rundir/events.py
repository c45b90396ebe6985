"""The run's audit log ``runs/<id>/events.jsonl``: one strict-JSON object per line, appended, never rewritten.

Every actor that changes a run writes here: the watchdog rules applied in the trainer (``source="watchdog"``),
CLI requests (``"control"``), the process beside the trainer (``"monitor"``) and the trainer itself
(``"trainer"``). A record is ``{"time", "kind", "step", "attempt", "source", "message", **details}``; ``time``
is ISO 8601 in UTC. Non-finite floats are written as the strings ``"nan"``, ``"inf"`` and ``"-inf"`` (bare
``NaN`` is not JSON and breaks strict readers such as ``jq``).

Why one ``os.write`` on an ``O_APPEND`` descriptor is enough for concurrent appenders on a local filesystem:
with ``O_APPEND`` the kernel moves the offset to the end and writes in one step, under the inode's lock, so
two processes appending a whole line each with one ``write`` never interleave or overwrite each other (POSIX
promises the seek-and-write atomicity; Linux also serialises the data of regular-file writes). A line is a few
hundred bytes, far below any short-write threshold; a short write is reported, not retried, because a second
``write`` would no longer be atomic. The ``fsync`` makes the record durable before the caller acts on it.

On NFS, ``O_APPEND`` is emulated by the client (it looks up the size, then writes at that offset): appenders
on *one* client are still serialised, but two clients appending at the same instant can overwrite each other's
line. Here the monitor and rank 0 usually share the batch host, and the CLI writes rarely; a clobbered or torn
line is skipped by :func:`read_events`, never fatal. A process killed mid-``write`` cannot tear a line on a local
filesystem; a machine crash can, so :func:`append_event` starts its line with a newline when the file does
not end with one, and the damaged line stays alone on its line. (An appender that looks while another one's
line is being copied in may add a needless newline: a blank line, which readers skip.)

No torch, numpy or h5py here: the login-node CLI and the monitor import this module.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import operator
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from hpcppo import rule_actions
from hpcppo.rundir.paths import EVENTS, RunPaths

__all__ = ["EVENTS_FILE", "SOURCES", "WATCHDOG_ACTIONS", "EVENT_VIEWS", "PLOT_MARKS", "SHOWN", "Shown", "append_event",
           "kind_tail", "plot_mark", "read_events", "shown_in", "watchdog_kind"]

log = logging.getLogger(__name__)

EVENTS_FILE = EVENTS  # the file's name in the run directory
SOURCES: tuple[str, ...] = ("watchdog", "control", "monitor", "trainer")

# Event kinds, in the HDF5 log (the trainer's) and in events.jsonl (watchdog, control and monitor actions).
# The trainer:
RESUME = "resume"  # resumed from a checkpoint
PREEMPTED = "preempted"  # stopped on a preemption signal, checkpointed, requeue (exit 75)
PAUSED = "paused"  # stopped on a pause request (exit 76)
REQUEUE = "requeue"  # stopped for a requeue asked by a rule (exit 75)
CHECKPOINT_CORRUPT = "checkpoint.corrupt"  # a committed checkpoint found damaged at resume
SYNC_MISMATCH = "sync.mismatch"  # the rollout engine's log-probs are not the trainer's after a weight sync (stop)
CONTROL_ROLLBACK = "control.rollback"  # a `hpcppo rollback` request applied
CONTROL_REJECTED = "control.rejected"  # a `hpcppo rollback` request refused
WATCHDOG_PREFIX = rule_actions.EVENT_PREFIX  # + a rule's action (hpcppo.rule_actions), or SUPPRESSED
SUPPRESSED = "suppressed"  # an action a stronger one of the same step superseded
REARMED = "rearmed"  # the rule that paused a run may fire again: a person resumed it
# The CLI:
RUN_MOVED = "control.moved"  # a copied or moved run directory's job.sbatch rendered again for where it is now
# The monitor beside the trainer:
HANG = "hang"
TRAINER_DEAD = "trainer_dead"
MONITOR_ERROR = "monitor.error"
MONITOR_RESTARTED = "monitor.restarted"


#: The actions of watchdog rules, highest precedence first (their table: :mod:`hpcppo.rule_actions`); a rule's action
#: is recorded as ``watchdog.<action>``.
WATCHDOG_ACTIONS: tuple[str, ...] = rule_actions.PRECEDENCE

#: Where the events are shown (matched on a kind's last dotted part, :func:`kind_tail`, so that ``watchdog.rollback``
#: and ``control.rollback`` read alike): ``summary`` lists each such event (``hpcppo metrics summary``, the last
#: ten), ``compare`` counts them in its "watchdog / stops" row, ``plot`` draws them as a vertical line of a category.
EVENT_VIEWS: tuple[str, ...] = ("summary", "compare", "plot")
#: The plot's categories of marks, in legend order.
PLOT_MARKS: tuple[str, ...] = ("rollback", "pause", "resume")


class Shown(NamedTuple):
    """How the views show the events of one kind tail."""

    tail: str
    views: frozenset[str]  # a subset of EVENT_VIEWS
    mark: str | None  # the plot's category (one of PLOT_MARKS) when "plot" is in views


def _s(tail: str, views: str, mark: str | None = None) -> Shown:
    return Shown(tail, frozenset(views.split()), mark)


#: The one table of the views' event kinds; a tail that is not here is only counted (summary's counts).
SHOWN: tuple[Shown, ...] = (
    _s("rollback", "summary compare plot", "rollback"),  # watchdog.rollback, control.rollback
    _s("pause", "summary compare plot", "pause"),  # watchdog.pause
    _s(REQUEUE, "summary compare plot", "pause"),  # the trainer's requeue, watchdog.requeue
    _s("restart_critic", "summary compare"),
    _s("raise_kl_coef", "summary compare"),
    _s("set_grad_clip", "summary compare"),
    _s(SUPPRESSED, "summary"),
    _s(REARMED, "summary"),  # watchdog.rearmed
    _s(PAUSED, "summary compare plot", "pause"),
    _s(PREEMPTED, "summary plot", "pause"),
    _s(RESUME, "summary plot", "resume"),
    _s(HANG, "summary compare"),
    _s(TRAINER_DEAD, "summary compare"),
    _s("mismatch", "summary compare"),  # sync.mismatch: the weight-sync guard stopped the run (a stop, as hang)
)


def shown_in(view: str) -> frozenset[str]:
    """The kind tails ``view`` (one of :data:`EVENT_VIEWS`) shows."""
    if view not in EVENT_VIEWS:
        raise ValueError(f"unknown view {view!r}; views: {', '.join(EVENT_VIEWS)}")
    return frozenset(s.tail for s in SHOWN if view in s.views)


def plot_mark(kind: str) -> str | None:
    """The plot's category of marks for an event of ``kind`` (one of :data:`PLOT_MARKS`), or None."""
    tail = kind_tail(kind)
    return next((s.mark for s in SHOWN if s.tail == tail and "plot" in s.views), None)


def watchdog_kind(action: str) -> str:
    """The kind of the event a watchdog rule's ``action`` (``rollback``, ``pause`` ...) is recorded as."""
    return f"{WATCHDOG_PREFIX}{action}"


def kind_tail(kind: str) -> str:
    """A kind's last dotted part, so that ``watchdog.pause`` and the trainer's ``pause`` read alike."""
    return kind.rsplit(".", 1)[-1]
_RESERVED = ("time", "kind", "step", "attempt", "source", "message")
# The same rule as the HDF5 log's event kinds, so an event can be mirrored there unchanged.
_KIND_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")


def _jsonable(value: Any) -> Any:
    """Plain JSON values; non-finite floats as strings; numpy-like scalars through ``.item()``; other objects
    as ``str(value)``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    item = getattr(value, "item", None)  # numpy / torch scalars, without importing either
    if callable(item):
        try:
            return _jsonable(item())
        except (TypeError, ValueError):
            pass
    # Anything else is kept as its text: an audit record must not make the trainer fail.
    return str(value)


def _opt_int(value: int | None, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"event {name} must be an int or None, got {value!r}")
    try:
        return operator.index(value)  # numpy integers too
    except TypeError:
        raise TypeError(f"event {name} must be an int or None, got {value!r}") from None


def append_event(run_dir: str | os.PathLike[str], *, kind: str, step: int | None, source: str, message: str = "",
                 attempt: int | None = None, **details: Any) -> dict[str, Any]:
    """Append one record to ``<run_dir>/events.jsonl`` (created if missing) and fsync it; return the record.

    Raises:
        ValueError: ``kind`` is not a short identifier (``[a-z][a-z0-9_.-]*``, at most 64 characters),
            ``source`` is not one of :data:`SOURCES`, or a detail uses a reserved name (``time``).
        TypeError: ``step`` or ``attempt`` is not an int or None, or ``message`` is not a str.
        OSError: the file cannot be opened, written or synced (a short write included).
    """
    if not isinstance(kind, str) or not _KIND_RE.match(kind):
        raise ValueError(f"event kind {kind!r} must match {_KIND_RE.pattern}")
    if source not in SOURCES:
        raise ValueError(f"event source {source!r} is not one of {', '.join(SOURCES)}")
    if not isinstance(message, str):
        raise TypeError(f"event message must be a str, got {type(message).__name__}")
    clash = sorted(set(details) & set(_RESERVED))
    if clash:
        raise ValueError(f"event detail name(s) {clash} are reserved ({', '.join(_RESERVED)})")
    record: dict[str, Any] = {
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
        "kind": kind,
        "step": _opt_int(step, "step"),
        "attempt": _opt_int(attempt, "attempt"),
        "source": source,
        "message": message,
    }
    record.update({str(k): _jsonable(v) for k, v in details.items()})
    line = (json.dumps(record, allow_nan=False, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    path = RunPaths(run_dir).events
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)  # RDWR: one pread of the last byte
    try:
        if not _ends_with_newline(fd):
            line = b"\n" + line  # the previous writer died mid-line: keep its fragment on a line of its own
        written = os.write(fd, line)
        if written != len(line):
            raise OSError(f"{path}: short write ({written} of {len(line)} bytes); the event line may be torn")
        os.fsync(fd)
    finally:
        os.close(fd)
    return record


def _ends_with_newline(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size == 0 or os.pread(fd, 1, size - 1) == b"\n"


def read_events(run_dir: str | os.PathLike[str], *, kinds: str | Iterable[str] | None = None,
                last: int | None = None) -> list[dict[str, Any]]:
    """Records of ``<run_dir>/events.jsonl`` in file order; ``[]`` when the file does not exist.

    Args:
        kinds: keep only these kinds (a single kind may be given as a string).
        last: keep only the last ``last`` records (after the kind filter).

    A line that is not a JSON object (the torn last line of a writer that died, a line clobbered on NFS) is
    skipped with a warning; non-finite values stay as the strings ``"nan"``/``"inf"``/``"-inf"``.
    """
    path = RunPaths(run_dir).events
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    wanted = None if kinds is None else ({kinds} if isinstance(kinds, str) else set(kinds))
    out = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except ValueError:  # UnicodeDecodeError and JSONDecodeError both
            record = None
        if not isinstance(record, dict):
            log.warning("%s: line %d is not a whole event record; skipped", path, number)
            continue
        if wanted is None or record.get("kind") in wanted:
            out.append(record)
    if last is not None:
        if last < 0:
            raise ValueError(f"last must be >= 0, got {last}")
        out = out[len(out) - last:] if last else []
    return out
