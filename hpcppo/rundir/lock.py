"""The run's writer lock: one command at a time changes a run.

**One writer per run.** Every command that changes a run (submit, resume, cancel, rollback, and the watchdog
monitor's restart) holds :func:`hold` (through :meth:`hpcppo.rundir.RunDir.lock`) while it decides and acts; a second one fails at once with
:class:`~hpcppo.errors.RunBusyError` naming the holder (command, pid, host, since when). The lock is the file
``<run>/.lock`` (``paths.LOCK``), created with ``link(2)`` of a fully written private file (``<lock>.<host>.<pid>.<hex>``) onto
that name. ``link`` is atomic and exclusive on every file system runs live on: local disks, NFS (v2 onwards,
where ``O_EXCL`` was not; a reply lost and retried shows as the private file's link count of 2, and counts as
won), Lustre and GPFS; no ``flock``/``fcntl`` support is needed (Lustre mounted without ``-o flock`` has none;
the ``filelock`` package's Unix lock is ``flock`` and its soft lock has no owner or staleness). Where hard
links are refused (some FUSE/SMB mounts) the lock file is created with ``O_CREAT|O_EXCL`` instead. A holder
that died leaves its file behind: on the same host it is stale when its pid is gone (or is another process,
by its start time); from another host when the file is older than :data:`LOCK_STALE_S` (ages are measured
against the file system's own clock, the mtime of the private file just written, so clock skew between hosts
does not matter). A stale lock is renamed aside (atomic: of several breakers one wins) and checked to be the
one judged stale before it is deleted. Release deletes the file only while it still carries our token.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import secrets
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpcppo.errors import PathError, RunBusyError

LOCK_STALE_S = 600.0
"""A lock held this long by a process on another host (whose pid we cannot check) is taken to be abandoned:
the commands that hold it (a status query, one ``sbatch``) take seconds."""


@contextlib.contextmanager
def hold(path: Path, run_id: str, action: str) -> Iterator[None]:
    """Hold the lock file ``path`` of run ``run_id`` for ``action`` (the command's name, shown to whoever finds
    the run busy). Re-entrant within a process (a rollback resumes)."""
    key = (os.getpid(), str(Path(path).resolve()))
    if key in _HELD:
        yield
        return
    token = _acquire(path, run_id, action)
    _HELD.add(key)
    try:
        yield
    finally:
        _HELD.discard(key)
        _release(path, token)


_HELD: set[tuple[int, str]] = set()
"""(pid, run directory) of the locks this process holds; the pid keeps a forked child from inheriting them."""


# ----------------------------------------------------------------------------- the lock's mechanics
def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), to tell a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def _pid_alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    return start is None or _proc_start(pid) in (None, start)


def _read_owner(path: Path) -> dict[str, Any] | None:
    try:
        owner = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def _is_stale(owner: dict[str, Any] | None, age_s: float) -> bool:
    if owner is not None and owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int):
        return not _pid_alive(owner["pid"], owner.get("pid_start"))
    # Another host's (or an unreadable, half-written) lock: only its age tells.
    return age_s > LOCK_STALE_S


def _busy(run_id: str, owner: dict[str, Any] | None, path: Path) -> RunBusyError:
    if owner is None:
        return RunBusyError(f"run {run_id} is being changed by another command (lock {path})",
                            hint=f"try again in a moment; a lock left by a crash is removed after {LOCK_STALE_S:.0f} s")
    return RunBusyError(f"run {run_id} is being changed by `hpcppo {owner.get('action', '?')}`, pid {owner.get('pid')} "
                        f"on host {owner.get('host')} since {owner.get('time')}",
                        hint=f"try again when it is done; lock file {path}")


def _acquire(path: Path, run_id: str, action: str) -> str:
    token = secrets.token_hex(8)
    host = socket.gethostname()
    owner = {"action": action, "host": host, "pid": os.getpid(), "pid_start": _proc_start(os.getpid()),
             "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "token": token,
             "argv": " ".join(sys.argv)[:300]}
    data = (json.dumps(owner) + "\n").encode()
    mine = path.with_name(f"{path.name}.{host}.{os.getpid()}.{token}")
    try:
        fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        raise PathError(f"cannot lock run {run_id}: {mine.parent}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        for _ in range(5):
            if _take(path, mine, data):
                return token
            try:
                age = os.stat(mine).st_mtime - os.stat(path).st_mtime
            except FileNotFoundError:
                continue  # released meanwhile: try again
            holder = _read_owner(path)
            if holder is not None and holder.get("token") == token:
                return token
            if not _is_stale(holder, age):
                raise _busy(run_id, holder, path)
            _break(path, holder, token)
        raise _busy(run_id, _read_owner(path), path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(mine)


def _take(path: Path, mine: Path, data: bytes) -> bool:
    """One attempt at creating ``path`` holding ``data``: True when it is ours."""
    try:
        os.link(mine, path)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        with contextlib.suppress(OSError):
            if os.stat(mine).st_nlink == 2:  # NFS: the link was made, its reply was lost
                return True
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK):
            raise PathError(f"cannot lock {path.parent}: {exc.strerror}") from None
    # No hard links here: O_EXCL (atomic on local file systems, NFSv3+ and Lustre).
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    except OSError as exc:
        raise PathError(f"cannot lock {path.parent}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return True


def _break(path: Path, holder: dict[str, Any] | None, token: str) -> None:
    """Remove a stale lock: rename it aside (one breaker wins), delete it if it is the one judged stale, else put
    it back (it was replaced by a live one between our look and the rename)."""
    aside = path.with_name(f"{path.name}.stale.{token}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    moved = _read_owner(aside)
    same = moved is None if holder is None else moved is not None and moved.get("token") == holder.get("token")
    if same:
        os.unlink(aside)
        return
    with contextlib.suppress(OSError):
        os.link(aside, path)
    with contextlib.suppress(OSError):
        os.unlink(aside)


def _release(path: Path, token: str) -> None:
    owner = _read_owner(path)
    if owner is not None and owner.get("token") == token:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
