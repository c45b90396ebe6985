"""Run directories: ids, layout, atomic writes and the attempt record (``run.json``).

A run directory ``<runs_root>/<run-id>/`` holds the experiment as given (``spec.toml``), the resolved
config (``resolved.toml``, the job's only input), the exact script (``job.sbatch``), the attempt record
(``run.json``), and what the job produces (``metrics/``, ``checkpoints/``, ``control/``, ``logs/``).

Creation is all-or-nothing: files are written into a hidden temporary directory beside the target and
renamed into place, so a failure never leaves a half-written run directory. No torch import here.

**One writer per run.** Every command that changes a run (submit, resume, cancel, rollback, and the watchdog
monitor's restart) holds :meth:`RunDir.lock` while it decides and acts; a second one fails at once with
:class:`~hpcppo.errors.RunBusyError` naming the holder (command, pid, host, since when). The lock is the file
``<run>/.lock``, created with ``link(2)`` of a fully written private file (``.lock.<host>.<pid>.<hex>``) onto
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
import re
import secrets
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hpcppo.errors import PathError, RunBusyError, RunIdError, RunRecordError
from hpcppo.fsutil import atomic_write_json, fsync_dir

# Ids a user types: the alphabet of new_run_id's ids, no separators, no dot-only names.
_SAFE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

SPEC = "spec.toml"
RESOLVED = "resolved.toml"
SCRIPT = "job.sbatch"
RUN_JSON = "run.json"
SUBDIRS = ("metrics", "checkpoints", "control", "logs")
LOCK = ".lock"
LOCK_STALE_S = 600.0
"""A lock held this long by a process on another host (whose pid we cannot check) is taken to be abandoned:
the commands that hold it (a status query, one ``sbatch``) take seconds."""


def new_run_id(name: str, now: _dt.datetime | None = None) -> str:
    """``<name>-<yyyymmdd-hhmmss>-<4 hex>`` (UTC)."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    run_id = f"{name}-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
    return validate_run_id(run_id)


def validate_run_id(run_id: str) -> str:
    """Reject anything that could escape the runs root (``/``, ``..``, NUL, leading dot or dash)."""
    if not isinstance(run_id, str) or not _SAFE_ID_RE.match(run_id) or ".." in run_id:
        raise RunIdError(
            f"invalid run id {run_id!r}",
            hint="run ids look like <name>-<yyyymmdd-hhmmss>-<4 hex>: letters, digits, '_', '.', '-', "
            "no '/' or '..'",
        )
    return run_id


# --------------------------------------------------------------------------- layout
class RunDir:
    """Paths inside one run directory. Construct with :meth:`open` (validates the id)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def open(cls, runs_root: Path | str, run_id: str) -> "RunDir":
        run_id = validate_run_id(run_id)
        root = Path(runs_root).resolve()
        path = (root / run_id).resolve()
        if path.parent != root:  # belt and braces: never leave the runs root
            raise RunIdError(f"run id {run_id!r} escapes the runs root {root}")
        if not (path / RESOLVED).is_file():
            known = [r.run_id for r in list_runs(root)]
            hint = f"runs under {root}: {', '.join(known[-10:])}" if known else f"no runs under {root}"
            raise RunIdError(f"no run {run_id!r}", hint=hint)
        return cls(path)

    @property
    def run_id(self) -> str:
        return self.path.name

    spec = property(lambda self: self.path / SPEC)
    resolved = property(lambda self: self.path / RESOLVED)
    script = property(lambda self: self.path / SCRIPT)
    run_json = property(lambda self: self.path / RUN_JSON)
    metrics = property(lambda self: self.path / "metrics")
    checkpoints = property(lambda self: self.path / "checkpoints")
    control = property(lambda self: self.path / "control")
    logs = property(lambda self: self.path / "logs")

    # ------------------------------------------------------------------ run.json
    def read_record(self) -> dict[str, Any]:
        """``run.json`` (``{"run_id", "attempts": [...]}``); an empty record before the first submission.

        ``RunRecordError`` (also a ``ValueError``) when the file is not a JSON object with a list of attempt
        objects: it is never silently replaced, since it is the only list of the run's jobs.
        """
        try:
            text = self.run_json.read_bytes()
        except FileNotFoundError:
            return {"run_id": self.run_id, "attempts": []}
        except OSError as exc:
            raise RunRecordError(f"{self.run_json}: cannot read: {exc.strerror}") from None
        try:
            record = json.loads(text)
        except (UnicodeDecodeError, ValueError) as exc:
            raise RunRecordError(f"{self.run_json}: not valid JSON ({exc}); it should list the run's attempts: "
                                 f"restore it from a backup or remove the run directory") from None
        attempts = record.get("attempts", []) if isinstance(record, dict) else None
        if not isinstance(attempts, list) or not all(isinstance(a, dict) and "job_id" in a for a in attempts):
            raise RunRecordError(f"{self.run_json}: not a run record (want a JSON object whose \"attempts\" is a "
                                 f"list of objects with a \"job_id\")")
        return record

    def write_record(self, record: Mapping[str, Any]) -> None:
        atomic_write_json(self.run_json, dict(record))

    @contextlib.contextmanager
    def _record_lock(self) -> Iterator[None]:
        """Serialise read-modify-write of ``run.json`` between processes (CLI, job, watchdog).

        Best effort: file systems mounted without ``flock`` (some Lustre sites) get no lock, and the
        atomic rename still guarantees readers never see a torn file.
        """
        import fcntl

        try:
            fd = os.open(self.path / ".run.json.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            yield
            return
        try:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def add_attempt(self, **attempt: Any) -> dict[str, Any]:
        """Append an attempt (job id, submit time, state ...) to ``run.json`` and return the record."""
        with self._record_lock():
            record = self.read_record()
            attempt.setdefault("submitted_at", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
            record.setdefault("attempts", []).append(dict(attempt))
            self.write_record(record)
        return record

    def update_last_attempt(self, **fields: Any) -> dict[str, Any]:
        with self._record_lock():
            record = self.read_record()
            if record.get("attempts"):
                record["attempts"][-1].update(fields)
                self.write_record(record)
        return record

    def update_attempt(self, job_id: str, **fields: Any) -> bool:
        """Update the latest attempt with this job id (not blindly the last one: another process may
        have added an attempt since the caller read the record). False when there is none."""
        with self._record_lock():
            record = self.read_record()
            for attempt in reversed(record.get("attempts", [])):
                if str(attempt.get("job_id")) == str(job_id):
                    attempt.update(fields)
                    self.write_record(record)
                    return True
        return False

    # ------------------------------------------------------------------ one writer
    @contextlib.contextmanager
    def lock(self, action: str) -> Iterator[None]:
        """Hold the run's writer lock while changing it (see the module docstring); ``action`` names the command
        for whoever finds the run busy (``RunBusyError``). Re-entrant within a process (a rollback resumes)."""
        key = (os.getpid(), str(self.path.resolve()))
        if key in _HELD:
            yield
            return
        token = _acquire(self.path / LOCK, self.run_id, action)
        _HELD.add(key)
        try:
            yield
        finally:
            _HELD.discard(key)
            _release(self.path / LOCK, token)


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
    mine = path.with_name(f"{LOCK}.{host}.{os.getpid()}.{token}")
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
    aside = path.with_name(f"{LOCK}.stale.{token}")
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


def list_runs(runs_root: Path | str) -> list[RunDir]:
    root = Path(runs_root)
    if not root.is_dir():
        return []
    runs = [RunDir(p) for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / RESOLVED).is_file()]
    return sorted(runs, key=lambda r: r.run_id)


@contextlib.contextmanager
def create_run_dir(runs_root: Path | str, run_id: str, *, origin: str = "") -> Iterator[Path]:
    """Yield a temporary directory to fill; on success it is renamed to ``<runs_root>/<run_id>``.

    On any exception the temporary directory is removed: no half-written run directory is left. A runs
    root that cannot hold run directories is a ``PathError`` naming it and ``origin`` (where its value came
    from, e.g. ``--runs-root``); a run id that is taken, before or during the rename, a ``RunIdTakenError``
    (the caller picks another id).
    """
    validate_run_id(run_id)
    root = Path(runs_root)
    _ensure_runs_root(root, origin)
    final = root / run_id
    if final.exists():
        raise RunIdTakenError(f"run directory {final} already exists")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{run_id}.", suffix=".tmp", dir=root))
    except OSError as exc:
        raise _root_error(root, origin, f"cannot create a directory in it ({exc.strerror})") from None
    try:
        for sub in SUBDIRS:
            (tmp / sub).mkdir()
        yield tmp
        try:
            os.rename(tmp, final)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):  # made by someone else since the check above
                raise RunIdTakenError(f"run directory {final} already exists") from None
            raise
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class RunIdTakenError(RunIdError):
    """The run directory of a freshly drawn run id exists already (:func:`create_run_dir`)."""


def _root_error(root: Path, origin: str, problem: str) -> PathError:
    where = f" (from {origin})" if origin else ""
    return PathError(f"runs root {root}{where}: {problem}",
                     hint="it must be a directory you can write; set --runs-root, $HPCPPO_RUNS_ROOT or the site's "
                          "paths.runs_root")


def _ensure_runs_root(root: Path, origin: str) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise _root_error(root, origin, "exists and is not a directory") from None
    except OSError as exc:
        raise _root_error(root, origin, f"cannot create it ({exc.strerror})") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise _root_error(root, origin, "is not writable")
