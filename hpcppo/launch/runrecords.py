"""What a run's own records say about its job, read for :mod:`hpcppo.launch.status`: one read of the run directory
(:func:`read_facts`: ``resolved.toml``'s plan, ``run.json``, the committed checkpoints, ``control/PAUSED``, the
directory ``job.sbatch`` runs in), the exit records ``control/exit-code.<attempt>``, the watchdog monitor's
heartbeat, and a local-executor job's controller process and submitit result files.

No torch and no subprocesses here (the login-node CLI uses it); nothing here decides a state: that is
:func:`hpcppo.launch.status.verdict`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import pickle
import time
from pathlib import Path
from typing import Any

import attrs

from hpcppo.errors import RunRecordError
from hpcppo.launch.shell import script_run_dir
from hpcppo.rundir import RunDir, control, exitcodes, heartbeat
from hpcppo.rundir.checkpoints import latest_committed
from hpcppo.timefmt import format_elapsed


def parse_time(text: str | None) -> _dt.datetime | None:
    """An ISO 8601 time of ``run.json`` (naive: UTC); None when missing or malformed."""
    if not text:
        return None
    try:
        t = _dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


# ----------------------------------------------------------------------------- the run directory, read once
@attrs.frozen(kw_only=True)
class RunFacts:
    """What one run's directory says before its jobs are asked about (:func:`read_facts`)."""

    site: str  # the site's name (resolved.toml), "?" when it cannot be read
    scheduler: str  # "slurm", "local", "?"
    world_size: int
    roles: str  # the ranks' roles: "2 ranks, colocated" or "3 trainer + 1 rollout ranks, split, max_staleness 1"
    total_steps: int | None
    time_limit_s: float | None
    signal_lead_s: float
    time_limit: str | None  # as the plan wrote it ("00:10:00")
    kind: str  # the job kind: "train", "preflight"
    watchdog: bool  # experiment.watchdog.enable
    record: dict[str, Any]  # run.json (its attempts); {"attempts": []} when unreadable
    unreadable: str | None  # why run.json cannot be read; None when it could
    latest_checkpoint: int | None  # the newest committed checkpoint
    paused: bool  # control/PAUSED exists
    paused_reason: str | None  # its text, when paused
    moved_from: str | None  # the directory job.sbatch runs in when not this one (:func:`script_elsewhere`)

    @property
    def attempts(self) -> list[dict[str, Any]]:
        attempts: list[dict[str, Any]] = self.record.get("attempts", [])
        return attempts


def read_facts(run: RunDir) -> RunFacts:
    """One read of ``run``'s own records (an unreadable ``run.json`` is said in ``unreadable``, not raised)."""
    try:
        record, unreadable = run.read_record(), None
    except RunRecordError as exc:  # this run only: the others are still listed
        record, unreadable = {"attempts": []}, str(exc)
    paused = control.is_paused(run)
    return RunFacts(**_plan_facts(run), record=record, unreadable=unreadable,
                    latest_checkpoint=latest_committed(run.checkpoints), paused=paused,
                    paused_reason=control.paused_reason(run) if paused else None,
                    moved_from=script_elsewhere(run))  # fmt: skip


def _plan_facts(run: RunDir) -> dict[str, Any]:
    """Site, scheduler and the planned job from a run's resolved.toml, without building the config objects."""
    import tomllib

    try:
        data = tomllib.loads(run.resolved.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        data = {}
    site = data.get("site", {}) if isinstance(data.get("site"), dict) else {}
    plan = data.get("plan", {}) if isinstance(data.get("plan"), dict) else {}
    job = data.get("job", {}) if isinstance(data.get("job"), dict) else {}
    return {"site": site.get("name", "?"), "scheduler": site.get("scheduler", "?"),
            "world_size": plan.get("world_size", 1), "roles": _roles(plan, data.get("experiment")),
            "total_steps": plan.get("total_steps"),
            "time_limit_s": plan.get("time_limit_s"), "signal_lead_s": plan.get("signal_lead_s", 0),
            "time_limit": plan.get("time_limit"), "kind": job.get("kind", "train"),
            "watchdog": _watchdog_enabled(data)}


def _roles(plan: dict[str, Any], experiment: Any) -> str:
    """The ranks' roles as a resolved.toml's plan (and rollout.max_staleness) says them (hpcppo.placement)."""
    world, rollout = plan.get("world_size", 1), plan.get("rollout_ranks", 0)
    if plan.get("placement") != "split" or not isinstance(world, int) or not isinstance(rollout, int):
        return f"{world} ranks, colocated"
    ro = experiment.get("rollout") if isinstance(experiment, dict) else None
    staleness = ro.get("max_staleness", 1) if isinstance(ro, dict) else "?"
    return f"{world - rollout} trainer + {rollout} rollout ranks, split, max_staleness {staleness}"


def _watchdog_enabled(resolved: dict[str, Any]) -> bool:
    """``experiment.watchdog.enable`` of a resolved.toml's data (its default, true, when not said)."""
    experiment = resolved.get("experiment")
    watchdog = experiment.get("watchdog") if isinstance(experiment, dict) else None
    return bool(watchdog.get("enable", True)) if isinstance(watchdog, dict) else True


def script_elsewhere(run: RunDir) -> str | None:
    """The directory ``job.sbatch`` runs in when it is not ``run``'s (a run directory copied or moved elsewhere and
    not resumed since: its jobs wrote there); None when it runs here or says nothing."""
    try:
        named = script_run_dir(run.script.read_text(errors="replace"))
    except OSError:
        return None
    if named is None or os.path.realpath(named) == os.path.realpath(run.path):
        return None
    return named


def remember_final_state(run: RunDir, record: dict[str, Any], job_id: str, state: str) -> None:
    """Write a final state the scheduler reported into the run's last attempt, on disk and in ``record`` (best
    effort: a run directory we may not write, e.g. a colleague's, is only read)."""
    attempts = record.get("attempts", [])
    if not attempts or attempts[-1].get("state") == state:
        return
    seen = {"state": state, "state_seen_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    try:
        if run.update_attempt(job_id, **seen):
            attempts[-1].update(seen)
    except OSError:
        pass


# ----------------------------------------------------------------------------- one attempt's records
def attempt_exit(run: RunDir, attempt_key: str) -> tuple[int | None, str | None]:
    """The code in ``control/exit-code.<attempt_key>`` (None when missing or not a number) and the explanation
    written with it (a diagnosed failure; None when there is none)."""
    return exitcodes.read_exit_record(run.path, attempt_key), exitcodes.read_exit_reason(run.path, attempt_key)


def slurm_attempt_key(run: RunDir, job_id: str, restarts: int | None) -> str:
    """``<job>.<restart>`` as the batch script names this run of the job (``HPCPPO_ATTEMPT``); with the restart
    count unknown, the newest run that left a record."""
    if restarts is not None:
        return f"{job_id}.{restarts}"
    found = run.exit_records_of(job_id)
    return f"{job_id}.{max(found) if found else 0}"


MONITOR_START_GRACE_S = 60.0
"""A running attempt this young may not have written its monitor's first heartbeat yet."""


def monitor_liveness(run: RunDir, attempt_key: str, elapsed_s: float | None, *, now: float | None = None) -> str:
    """``alive``, ``starting (...)`` or ``not alive (why)`` for the watchdog monitor of a running attempt, from its
    heartbeat (:mod:`hpcppo.rundir.heartbeat`): stale, or missing once the attempt has run
    :data:`MONITOR_START_GRACE_S`."""
    now = time.time() if now is None else now
    beat = heartbeat.read(run.path, attempt_key)
    log = run.watchdog_log(attempt_key).relative_to(run.path)
    if beat is None:
        if elapsed_s is None or elapsed_s < MONITOR_START_GRACE_S:
            return "starting (no heartbeat yet)"
        return (f"not alive (no heartbeat in {format_elapsed(elapsed_s)} of this attempt; hangs go undetected; "
                f"see {log})")
    age, limit = now - float(beat["time"]), heartbeat.stale_after_s(float(beat.get("interval_s", 30.0)))
    if age <= limit:
        return "alive"
    return (f"not alive (last heartbeat {age:.0f} s ago from pid {beat.get('pid')} on {beat.get('host')}, more than "
            f"{limit:.0f} s; hangs go undetected; see {log})")


# ----------------------------------------------------------------------------- local jobs (submitit's LocalExecutor)
@attrs.frozen(kw_only=True)
class LocalJob:
    """What a local-executor job's processes did (:func:`local_job_info`), before the exit record is read."""

    state: str  # RUNNING, COMPLETED, FAILED or CANCELLED
    reason: str | None  # the failing rank's last error line, or why the job looks cancelled
    codes: dict[int, int]  # rank -> the job script's exit code, for ranks that returned one
    ended_at: float | None  # POSIX time of the last result file; None while running


def local_controller_alive(job_id: str, folder: Path | None = None) -> bool:
    """The local executor's job id is its controller's pid: alive, not a zombie, and still submitit's
    controller (of ``folder`` when given, so a reused pid never counts)."""
    try:
        cmdline = Path(f"/proc/{int(job_id)}/cmdline").read_bytes()
        status = Path(f"/proc/{int(job_id)}/status").read_text()
    except (OSError, ValueError):
        return False
    zombie = any(line.startswith("State:") and "Z" in line.split()[1] for line in status.splitlines())
    if zombie or b"submitit" not in cmdline:
        return False
    return folder is None or os.fsencode(str(folder)) in cmdline.split(b"\0")


class _PlainDataUnpickler(pickle.Unpickler):
    """submitit's result files hold ``("success", value)`` or ``("error", traceback text)``: plain data.

    Refusing every global keeps ``status`` from importing (or running) anything while reading them:
    a result object of some other class reads as an unknown outcome instead.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name} in a submitit result file")


def _local_outcome(path: Path) -> tuple[str, Any]:
    """``(outcome, payload)`` of one local task's result file: ``success``/``error``/``missing``/``unknown``."""
    try:
        with path.open("rb") as f:
            data = _PlainDataUnpickler(f).load()
    except FileNotFoundError:
        return "missing", None
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError):
        return "unknown", None
    if isinstance(data, tuple) and len(data) == 2 and data[0] in ("success", "error"):
        return data[0], data[1]
    return "unknown", None


def local_job_info(run: RunDir, job_id: str, ntasks: int) -> LocalJob:
    """State of a local-executor job from its controller process and submitit's result files.

    The failing rank named is the one that failed first: a rank ended by a signal (a kill), else the earliest
    result file. A rank that dies takes its peers down with it (their collectives fail), and naming rank 0 for
    every failure would hide which rank was killed.
    """
    # submitit has no public way to name a task's result file without registering a Job with its watcher.
    from submitit.core.utils import JobPaths

    if local_controller_alive(job_id, run.submitit):
        return LocalJob(state="RUNNING", reason=None, codes={}, ended_at=None)
    outcomes, codes, ended_at = [], {}, None
    errors: list[tuple[bool, float, int, str]] = []  # (not killed, when, rank, last line)
    for task in range(ntasks):
        path = JobPaths(run.submitit, job_id=job_id, task_id=task).result_pickle
        outcome, payload = _local_outcome(path)
        outcomes.append(outcome)
        mtime = None
        if outcome != "missing":
            with contextlib.suppress(OSError):
                mtime = path.stat().st_mtime
                ended_at = max(ended_at or 0.0, mtime)
        if outcome == "success" and isinstance(payload, int) and not isinstance(payload, bool):
            codes[task] = payload
        if outcome == "error":
            lines = [ln.strip() for ln in str(payload).strip().splitlines() if ln.strip()]
            line = lines[-1] if lines else "failed"
            errors.append((" was ended by SIG" not in line, mtime if mtime is not None else float("inf"), task, line))
    if outcomes and all(o == "success" for o in outcomes):
        return LocalJob(state="COMPLETED", reason=None, codes=codes, ended_at=ended_at)
    if errors:
        _, _, rank, line = min(errors)
        others = f" ({len(errors) - 1} other rank(s) failed after it)" if len(errors) > 1 else ""
        return LocalJob(state="FAILED", reason=f"rank {rank}: {line}{others}", codes=codes, ended_at=ended_at)
    missing = [str(t) for t, o in enumerate(outcomes) if o != "success"]
    return LocalJob(state="CANCELLED", reason=f"controller gone; no result from rank(s) {', '.join(missing)}",
                    codes=codes, ended_at=ended_at)
