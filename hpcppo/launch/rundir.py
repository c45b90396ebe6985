"""Run directories: ids, layout, atomic writes and the attempt record (``run.json``).

A run directory ``<runs_root>/<run-id>/`` holds the experiment as given (``spec.toml``), the resolved
config (``resolved.toml``, the job's only input), the exact script (``job.sbatch``), the attempt record
(``run.json``), and what the job produces (``metrics/``, ``checkpoints/``, ``control/``, ``logs/``).

Creation is all-or-nothing: files are written into a hidden temporary directory beside the target and
renamed into place, so a failure never leaves a half-written run directory. No torch import here.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hpcppo.errors import RunIdError
from hpcppo.fsutil import atomic_write_json, fsync_dir

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}-\d{8}-\d{6}-[0-9a-f]{4}$")
# Looser pattern for ids a user types: same alphabet, no separators, no dot-only names.
_SAFE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

SPEC = "spec.toml"
RESOLVED = "resolved.toml"
SCRIPT = "job.sbatch"
RUN_JSON = "run.json"
SUBDIRS = ("metrics", "checkpoints", "control", "logs")


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
            known = sorted(p.name for p in root.iterdir() if (p / RESOLVED).is_file()) if root.is_dir() else []
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
        try:
            return json.loads(self.run_json.read_text())
        except FileNotFoundError:
            return {"run_id": self.run_id, "attempts": []}

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


def list_runs(runs_root: Path | str) -> list[RunDir]:
    root = Path(runs_root)
    if not root.is_dir():
        return []
    runs = [RunDir(p) for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / RESOLVED).is_file()]
    return sorted(runs, key=lambda r: r.run_id)


@contextlib.contextmanager
def create_run_dir(runs_root: Path | str, run_id: str) -> Iterator[Path]:
    """Yield a temporary directory to fill; on success it is renamed to ``<runs_root>/<run_id>``.

    On any exception the temporary directory is removed: no half-written run directory is left.
    """
    validate_run_id(run_id)
    root = Path(runs_root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / run_id
    if final.exists():
        raise RunIdError(f"run directory {final} already exists")
    tmp = Path(tempfile.mkdtemp(prefix=f".{run_id}.", suffix=".tmp", dir=root))
    try:
        for sub in SUBDIRS:
            (tmp / sub).mkdir()
        yield tmp
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
