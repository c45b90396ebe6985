"""What a ``RUN`` argument of ``hpcppo metrics summary|export`` and ``hpcppo compare`` names, and the one-line
errors for a run that has nothing to show yet. No torch.

A ``RUN`` is a run id under the runs root, or a path: a run directory, its ``metrics/`` directory, or one
metric file (``attempt-NNNN.h5``, or any copy of one). A run id is looked up only when no such path exists
and the text could be an id (no ``/``, no ``.h5``), so a mistyped path is reported as a missing path rather
than as a bad run id.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcppo.errors import PathError, RunStateError
from hpcppo.launch import status
from hpcppo.metrics import metric_files
from hpcppo.rundir import RunDir
from hpcppo.rundir.paths import RunPaths, in_metrics_dir, is_metrics_dir


@dataclass(frozen=True)
class Target:
    """One ``RUN`` argument, resolved."""

    name: str  # the run id, or the file's or directory's name
    path: Path  # what hpcppo.metrics.load takes
    run_dir: Path | None  # the run directory (resolved.toml, events.jsonl, run.json) when there is one

    @property
    def resolved(self) -> Path | None:
        return RunPaths(self.run_dir).resolved if self.run_dir is not None else None


def _run_dir_of(path: Path) -> Path | None:
    """The run directory ``path`` is, or whose ``metrics/`` directory it is or lies in."""
    if path.is_dir():
        candidates = [path, path.parent] if is_metrics_dir(path) else [path]
    else:
        candidates = [path.parent.parent] if in_metrics_dir(path) else []
    return next((c for c in candidates if RunPaths(c).resolved.is_file()), None)


def _exists(path: Path) -> bool:
    """``path.exists()``, False where the OS cannot even look it up (a name too long, a NUL byte): such a text
    is then judged as a run id by :func:`~hpcppo.rundir.validate_run_id`, the check every run command shares."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def resolve_target(text: str, runs_root: Callable[[], Path]) -> Target:
    """The run or file ``text`` names; ``runs_root`` is called only when ``text`` is a run id.

    Raises:
        PathError: a path that does not exist.
        RunIdError: no path, and no run of that id under the runs root (the message lists some).
    """
    path = Path(text).expanduser()
    if _exists(path):
        path = path.resolve()
        run_dir = _run_dir_of(path)
        if path.is_dir() and run_dir is None and RunPaths(path).metrics.is_dir():
            run_dir = path  # a run directory without resolved.toml (copied by hand): still a run
        name = run_dir.name if run_dir is not None else path.name
        return Target(name=name, path=path, run_dir=run_dir)
    if os.sep in text or text.endswith((".h5", ".hdf5")) or text in (".", ".."):
        raise PathError(f"{text}: no such run directory or metric file")

    run = RunDir.open(runs_root(), text)
    return Target(name=run.run_id, path=run.path, run_dir=run.path)


def resolve_targets(texts: Sequence[str], runs_root: Callable[[], Path]) -> list[Target]:
    root: list[Path] = []

    def once() -> Path:  # the site's runs root is read at most once, and only for run ids
        if not root:
            root.append(runs_root())
        return root[0]

    return [resolve_target(t, once) for t in texts]


def resolved_data(target: Target) -> dict[str, Any]:
    """The run's ``resolved.toml`` as plain data (``{}`` when there is none or it cannot be read)."""
    if target.resolved is None:
        return {}
    try:
        return tomllib.loads(target.resolved.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}


def total_steps(data: dict[str, Any]) -> int | None:
    """Planned training steps from resolved.toml data (``None``: unknown, or ``0`` = by epochs)."""
    plan: dict[str, Any] = data["plan"] if isinstance(data.get("plan"), dict) else {}
    trainer = (data.get("experiment") or {}).get("trainer") if isinstance(data.get("experiment"), dict) else None
    value = plan.get("total_steps", (trainer or {}).get("total_steps"))
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def no_rows_error(target: Target) -> RunStateError:
    """Why ``target`` has no row to show, in one line: a job not started yet, a run never submitted, a job that
    ended before its first row, or a log still empty."""
    files = metric_files(target.path)
    if target.resolved is None or not target.resolved.is_file():
        what = "has no metric file (attempt-NNNN.h5)" if not files else "has no row yet"
        return RunStateError(f"{target.name}: {what}")
    assert target.run_dir is not None  # a resolved.toml is in a run directory
    st = status.run_status(RunDir(target.run_dir))
    state, reason = st.state, st.reason
    job = f"job {st.job_id} is {state}" + (f" ({reason})" if reason else "")
    if state == "NOT_SUBMITTED":
        return RunStateError(f"{target.name}: no metrics: the run has not been submitted",
                             hint=f"hpcppo submit, or hpcppo resume {target.name}")
    if not files:
        if state in status.FINAL_STATES:
            return RunStateError(f"{target.name}: no metrics: the {job} and it never opened its metric log",
                                 hint=f"hpcppo logs {target.name}")
        return RunStateError(f"{target.name}: no metrics yet: the {job}", hint="try again once it runs")
    return RunStateError(f"{target.name}: its metric log has no row yet; the {job}",
                         hint="the first row comes after the first step" if state not in status.FINAL_STATES else None)


def damage_error(target: Target, damaged: dict[str, str]) -> PathError:
    """The one-line error for a log whose damage left no row to show."""
    path, what = next(iter(damaged.items()))
    more = f" (and {len(damaged) - 1} more damaged file(s))" if len(damaged) > 1 else ""
    return PathError(f"{path}: damaged metric log: {what}{more}")


class _NoDamageWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "damaged metric log" not in record.getMessage()


@contextlib.contextmanager
def damage_reported_by_caller() -> Iterator[None]:
    """Silence the reader's warnings about damaged files while the caller reports them itself (one line per
    file, from ``attrs["damaged"]``): a command that shows a damaged run says so once, not twice."""
    logger = logging.getLogger("hpcppo.metrics.reader")
    quiet = _NoDamageWarnings()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
