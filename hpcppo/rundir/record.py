"""Run directories: ids, creation, the attempt record (``run.json``) and :class:`RunDir`.

A run directory ``<runs_root>/<run-id>/`` holds the experiment as given (``spec.toml``), the resolved
config (``resolved.toml``, the job's only input), the exact script (``job.sbatch``), the attempt record
(``run.json``), and what the job produces (``metrics/``, ``checkpoints/``, ``control/``, ``logs/``).

Creation is all-or-nothing: files are written into a hidden temporary directory beside the target and
renamed into place, so a failure never leaves a half-written run directory. No torch import here.

The writer lock that every command changing a run holds is :mod:`hpcppo.rundir.lock`; the names of the
files are in :mod:`hpcppo.rundir.paths`.
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
import stat
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hpcppo.errors import PathError, RunIdError, RunRecordError
from hpcppo.fsutil import atomic_write_json, fsync_dir
from hpcppo.rundir.lock import hold
from hpcppo.rundir.paths import SUBDIRS, RunPaths

# Ids a user types: the alphabet of new_run_id's ids, no separators, no dot-only names.
_SAFE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


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


# --------------------------------------------------------------------------- one run
class RunDir(RunPaths):
    """One run directory: its paths (:class:`RunPaths`), its attempt record and its writer lock. Construct with
    :meth:`open` (validates the id)."""

    @classmethod
    def open(cls, runs_root: Path | str, run_id: str) -> "RunDir":
        run_id = validate_run_id(run_id)
        root = Path(runs_root).resolve()
        path = (root / run_id).resolve()
        if path.parent != root:  # belt and braces: never leave the runs root
            raise RunIdError(f"run id {run_id!r} escapes the runs root {root}")
        if not RunPaths(path).resolved.is_file():
            known = [r.run_id for r in list_runs(root)]
            hint = f"runs under {root}: {', '.join(known[-10:])}" if known else f"no runs under {root}"
            raise RunIdError(f"no run {run_id!r}", hint=hint)
        return cls(path)

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
            record: dict[str, Any] = json.loads(text)
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
            fd = os.open(self.run_json_lock, os.O_RDWR | os.O_CREAT, 0o644)
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
    def lock(self, action: str) -> contextlib.AbstractContextManager[None]:
        """Hold the run's writer lock while changing it (:func:`hpcppo.rundir.lock.hold`); ``action`` names the
        command for whoever finds the run busy (``RunBusyError``). Re-entrant within a process."""
        return hold(self.lock_file, self.run_id, action)


def list_runs(runs_root: Path | str) -> list[RunDir]:
    root = Path(runs_root)
    if not root.is_dir():
        return []
    runs = [RunDir(p) for p in root.iterdir()
            if p.is_dir() and not p.name.startswith(".") and RunPaths(p).resolved.is_file()]
    return sorted(runs, key=lambda r: r.run_id)


_GENERATED_ID_RE = re.compile(r".+-\d{8}-\d{6}-[0-9a-f]{4}")


def stray_entries(runs_root: Path | str) -> list[str]:
    """Entries of the runs root named like run ids (:func:`new_run_id`) that :func:`list_runs` skips because they
    are no run directory: a FIFO, a file, a dangling link, a directory without ``resolved.toml``. Each as
    ``"NAME (what it is)"``; a listing that hid them would report fewer runs than the user made."""
    root = Path(runs_root)
    if not root.is_dir():
        return []
    out = []
    for p in sorted(root.iterdir()):
        if p.name.startswith(".") or not _GENERATED_ID_RE.fullmatch(p.name):
            continue
        if p.is_dir():
            if not RunPaths(p).resolved.is_file():
                out.append(f"{p.name} (a directory without resolved.toml)")
            continue
        what = ("a FIFO" if stat.S_ISFIFO(p.lstat().st_mode) else "a dangling link" if not p.exists()
                else "a file" if p.is_file() else "not a directory")
        out.append(f"{p.name} ({what})")
    return out


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
        raise runs_root_error(root, origin, f"cannot create a directory in it ({exc.strerror})") from None
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


def runs_root_error(root: Path, origin: str, problem: str) -> PathError:
    where = f" (from {origin})" if origin else ""
    return PathError(f"runs root {root}{where}: {problem}",
                     hint="it must be a directory you can write; set --runs-root, $HPCPPO_RUNS_ROOT or the site's "
                          "paths.runs_root")


def _ensure_runs_root(root: Path, origin: str) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise runs_root_error(root, origin, "exists and is not a directory") from None
    except OSError as exc:
        raise runs_root_error(root, origin, f"cannot create it ({exc.strerror})") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise runs_root_error(root, origin, "is not writable")
