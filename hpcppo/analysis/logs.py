"""What a run left behind, read from a login node: its job logs, its events, and the list of runs.

* ``hpcppo logs RUN [--rank R | --watchdog] [--attempt A] [-f]``: :func:`find_log` picks the file,
  :func:`follow_file` tails it. A Slurm job writes its batch log to ``logs/slurm-<job>.out`` and each rank's output to
  ``logs/attempt-<job>.<restart>/rank-<r>.log``; a local job writes ``logs/attempt-local-<job>/rank-<r>.log`` (the job
  script runs once per rank there, so a local run has no batch log of its own). ``watchdog.log`` (the monitor's
  output, ``--watchdog``) sits beside the rank logs.
* ``hpcppo runs``: :func:`run_rows` is every run under a runs root, newest first, with its job state and how
  far its training got (step of total, last reward and KL from the metric log).

No torch, no matplotlib here.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import fnmatch
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, cast

import pandas as pd

from hpcppo.analysis import targets
from hpcppo.analysis.targets import resolve_target
from hpcppo.errors import HpcppoError, PathError, RunStateError
from hpcppo.launch.status import FINAL_STATES, statuses
from hpcppo.launch.statustext import state_text
from hpcppo.metrics import load, metric_files
from hpcppo.rundir import RunDir, list_runs
from hpcppo.rundir.paths import LOCAL_ATTEMPT_PREFIX, LOG_DIR_PREFIX, RANK_LOG_RE

_RUN_TIME = re.compile(r"-(\d{8}-\d{6})-[0-9a-f]{4}$")


# ----------------------------------------------------------------------------- which run
def open_run(text: str, runs_root: Callable[[], Path]) -> Any:
    """The run directory ``text`` names (a run id, or a path as :func:`~hpcppo.analysis.targets.resolve_target`
    takes it), as a :class:`~hpcppo.rundir.RunDir`.

    Raises:
        PathError: a path that does not exist or is no run directory (a lone metric file has no job).
        RunIdError: no such run under the runs root.
    """
    target = resolve_target(text, runs_root)
    if target.run_dir is None:
        raise PathError(f"{text}: not a run directory", hint="a run id, or a directory with resolved.toml")
    return RunDir(target.run_dir)


# ----------------------------------------------------------------------------- runs
def _created(run: Any) -> float:
    m = _RUN_TIME.search(run.run_id)
    if m:
        try:
            return _dt.datetime.strptime(m.group(1), "%Y%m%d-%H%M%S").replace(tzinfo=_dt.timezone.utc).timestamp()
        except ValueError:
            pass
    try:
        return run.resolved.stat().st_mtime
    except OSError:
        return 0.0


def total_steps(run: Any) -> int | None:
    """The run's planned number of training steps, from ``resolved.toml`` (``None`` when unknown)."""
    return targets.total_steps(targets.resolved_data(targets.Target(run.run_id, run.path, run.path)))


def last_value(frame: pd.DataFrame, column: str) -> float | None:
    """The last value of ``column`` that is not NaN (``None``: no such column, or no value yet)."""
    if column not in frame:
        return None
    values = frame[column].dropna()
    return float(values.iloc[-1]) if len(values) else None


def progress(run: Any) -> dict[str, Any]:
    """How far the run's training got: ``step`` (last logged), ``reward``, ``kl``, ``kl_coef`` (last finite values),
    ``last_row_time``; ``error`` when its metric log cannot be read. Only the newest attempt's file is read: its
    last row is always part of the current history."""
    out: dict[str, Any] = {"step": None, "reward": None, "kl": None, "kl_coef": None, "last_row_time": None}
    try:
        for path in reversed(metric_files(run.path)):
            frame = load(path)
            if len(frame):
                break
        else:
            return out
    except HpcppoError as exc:
        return out | {"error": str(exc)}
    out.update(step=int(frame["step"].iloc[-1]), last_row_time=float(frame["time"].iloc[-1]),
               reward=last_value(frame, "reward/mean"), kl=last_value(frame, "kl/actor_ref"),
               kl_coef=last_value(frame, "kl/coef"))
    return out


def known_states() -> list[str]:
    """State names a run can have (Slurm's, the local executor's and ours), for ``--state`` checks."""
    live = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED",
            "CONFIGURING", "COMPLETING", "STOPPED", "SIGNALING", "STAGE_OUT", "SPECIAL_EXIT", "RESV_DEL_HOLD"}
    return sorted(set(FINAL_STATES) | live | {"NOT_SUBMITTED", "UNKNOWN", "UNREADABLE"})


def check_states(states: Iterable[str]) -> set[str]:
    """``--state`` values (comma-separated allowed, any case) as a set of state names.

    Raises:
        HpcppoError: an unknown name (with did-you-mean).
    """
    known = known_states()
    wanted = {s.strip().upper() for text in states for s in text.split(",") if s.strip()}
    for state in sorted(wanted):
        if state not in known:
            close = difflib.get_close_matches(state, known, n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(close)}?" if close else f"states: {', '.join(known)}"
            raise HpcppoError(f"unknown state {state!r}", hint=hint)
    return wanted


def _name_matches(run_id: str, pattern: str) -> bool:
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(run_id, pattern)
    return pattern in run_id


def run_rows(runs_root: Path, *, states: Iterable[str] = (), name: str | None = None,
             now: float | None = None) -> list[dict[str, Any]]:
    """Every run under ``runs_root``, newest first: its status (:func:`hpcppo.launch.status.statuses`) plus
    ``created`` (unix), ``age_s``, ``total_steps`` and :func:`progress`.

    Args:
        states: keep runs in these states (see :func:`check_states`).
        name: keep run ids containing this text, or matching it as a glob when it has ``*?[``.
    """
    wanted = check_states(states) if states else set()
    runs = [r for r in list_runs(runs_root) if name is None or _name_matches(r.run_id, name)]
    runs.sort(key=lambda r: (_created(r), r.run_id), reverse=True)
    now = time.time() if now is None else now
    rows = []
    for run, st in zip(runs, statuses(runs)):
        if wanted and st.state not in wanted:
            continue
        created = _created(run)
        total = st.total_steps or total_steps(run)
        rows.append(st.to_dict() | {"created": created, "age_s": max(0.0, now - created), "total_steps": total} | progress(run))
    return rows


def format_age(seconds: float | None) -> str:
    """``42s``, ``7m``, ``3h``, ``5d``."""
    if seconds is None or math.isnan(seconds):
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def number_text(value: float | None, fmt: str = ".4g") -> str:
    """A number in a table or a status line, ``-`` when unknown."""
    return "-" if value is None else format(value, fmt)


RUN_COLUMNS = ("run", "state", "step", "reward", "kl", "site", "job", "age")


def run_row_cells(row: dict[str, Any]) -> tuple[str, ...]:
    """One row of the run table, in :data:`RUN_COLUMNS` order."""
    if row.get("error"):
        step = "unreadable"
    elif row["step"] is None:
        step = "-"
    else:
        step = f"{row['step']}/{row['total_steps'] if row['total_steps'] is not None else '?'}"
    return (row["run_id"], state_text(row["state"], row["reason"]), step, number_text(row["reward"]), number_text(row["kl"]), row["site"],
            str(row["job_id"] or "-"), format_age(row["age_s"]))


# ----------------------------------------------------------------------------- job logs
def _attempt_order(run: Any) -> dict[str, int]:
    jobs = [str(a.get("job_id")) for a in run.read_record().get("attempts", [])]
    return {job: i for i, job in enumerate(jobs)}


def _job_of(attempt: str) -> str:
    """The job id of a log attempt name: ``local-1745`` -> ``1745``, ``4242.1`` -> ``4242``."""
    return attempt.removeprefix(LOCAL_ATTEMPT_PREFIX).split(".")[0]


def log_attempts(run: Any) -> list[str]:
    """The attempts with a log directory (``local-1745``, ``4242.0``), oldest first."""
    if not run.logs.is_dir():
        return []
    order = _attempt_order(run)
    names = [p.name.removeprefix(LOG_DIR_PREFIX) for p in run.logs.iterdir()
             if p.is_dir() and p.name.startswith(LOG_DIR_PREFIX)]

    def key(name: str) -> tuple[int, int, float]:
        restart = name.split(".")[1] if "." in name else "0"
        try:
            mtime = run.log_dir(name).stat().st_mtime
        except OSError:
            mtime = 0.0
        return (order.get(_job_of(name), len(order)), int(restart) if restart.isdigit() else 0, mtime)

    return sorted(names, key=key)


def _pick_attempt(run: Any, attempt: str | None, attempts: Sequence[str]) -> str:
    if attempt is None:
        return attempts[-1]
    wanted = attempt.removeprefix(LOG_DIR_PREFIX)
    if wanted in attempts:
        return wanted
    of_job = [a for a in attempts if _job_of(a) == wanted]
    if of_job:
        return of_job[-1]  # the latest restart of that job
    raise PathError(f"{run.run_id}: no attempt {attempt!r}", hint=f"attempts: {', '.join(attempts)}")


def _ranks(folder: Path) -> list[int]:
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := RANK_LOG_RE.match(p.name)))


def find_log(run: Any, *, rank: int | None = None, attempt: str | None = None, watchdog: bool = False,
             scheduler: str | None = None) -> tuple[Path, str | None]:
    """The log file to show and a note about the choice (``None`` when there is nothing to say).

    Without ``rank``: the attempt's batch log (Slurm), or rank 0's log on a local run; with ``watchdog``: the
    attempt's ``watchdog.log``. Without ``attempt``: the newest attempt.

    Raises:
        RunStateError: the run has no log yet, or the attempt no watchdog log.
        PathError: no such attempt or rank (the message lists those that exist).
    """
    attempts = log_attempts(run)
    if not attempts:
        raise RunStateError(f"{run.run_id}: no job log yet", hint=f"nothing under {run.logs}")
    chosen = _pick_attempt(run, attempt, attempts)
    folder = run.log_dir(chosen)
    if watchdog:
        path = run.watchdog_log(chosen)
        if not path.is_file():
            raise RunStateError(f"{run.run_id}: attempt {chosen} has no watchdog log (the monitor did not run, or "
                                f"has not written yet)",
                                hint=f"in {folder}: {', '.join(sorted(p.name for p in folder.iterdir())) or 'nothing'}")
        return path, None
    ranks = _ranks(folder)
    if rank is None:
        batch = run.batch_log(_job_of(chosen))
        if batch.is_file() and not chosen.startswith(LOCAL_ATTEMPT_PREFIX):
            return batch, None
        if 0 in ranks:
            return run.rank_log(chosen, 0), (f"attempt {chosen} has no batch log (a local run's job script runs "
                                             f"in each rank): showing rank 0's log")
        raise RunStateError(f"{run.run_id}: attempt {chosen} has no batch log and no rank log yet",
                            hint=f"in {folder}: {', '.join(sorted(p.name for p in folder.iterdir())) or 'nothing'}")
    if rank not in ranks:
        listed = ", ".join(str(r) for r in ranks) or "none yet"
        raise PathError(f"{run.run_id}: attempt {chosen} has no log of rank {rank}", hint=f"ranks: {listed}")
    return run.rank_log(chosen, rank), None


def _tail_start(f: BinaryIO, lines: int) -> int:
    """Offset of the last ``lines`` lines of ``f``."""
    f.seek(0, os.SEEK_END)
    end = pos = f.tell()
    if lines <= 0:  # -n 0, as tail -n 0: nothing of what is there (-f then prints only what comes)
        return end
    found, block = 0, 65536
    while pos > 0:
        step = min(block, pos)
        pos -= step
        f.seek(pos)
        chunk = f.read(step)
        if pos + step == end and chunk.endswith(b"\n"):
            chunk = chunk[:-1]
        for i in range(len(chunk) - 1, -1, -1):
            if chunk[i] == 10:
                found += 1
                if found == lines:
                    return pos + i + 1
    return 0


def copy_log(path: Path, out: BinaryIO, *, lines: int | None = None) -> int:
    """Write ``path`` (its last ``lines`` lines when given) to ``out``; returns the offset reached."""
    with open(path, "rb") as f:
        start = 0 if lines is None else _tail_start(f, lines)
        f.seek(start)
        while chunk := f.read(1 << 20):
            out.write(chunk)
        out.flush()
        return f.tell()


def follow_file(path: Path, out: BinaryIO, *, offset: int, done: Callable[[], bool], poll_s: float = 0.5) -> None:
    """Write what is appended to ``path`` from ``offset`` on, until ``done()`` says the job ended (then what is
    left). A file that shrinks (rewritten by a requeued job) is read again from its start."""
    finished = False
    while True:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size < offset:
            offset = 0
        if size > offset:
            with open(path, "rb") as f:
                f.seek(offset)
                while chunk := f.read(1 << 20):
                    out.write(chunk)
                offset = f.tell()
            out.flush()
        if finished:
            return
        finished = done()  # one more read after the job ended: its last lines
        if not finished:
            time.sleep(poll_s)


def stdout_bytes() -> BinaryIO:
    return cast(BinaryIO, getattr(sys.stdout, "buffer", sys.stdout))
