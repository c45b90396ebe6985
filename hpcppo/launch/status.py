"""Job status, in one place: the states, what the scheduler and the run's own records say, and the text the CLI prints.

A run's status is one dict (see :func:`statuses`) built from these sources:

* Slurm, through :func:`hpcppo.launch.slurm.query_jobs` (one batched ``sacct``, then ``squeue``);
* a local run's submitit controller process and result files (:func:`local_job_info`);
* the job's own exit record ``control/exit-code.<attempt>``, written by rank 0 (and by the watchdog monitor on
  a hang): the scheduler only sees the batch script, which exits 0 after a requeue or a pause;
* the run directory: ``run.json`` (the attempts, and the last final state seen, which outlives the
  scheduler's memory of a job), ``control/PAUSED``, the committed checkpoints and the planned steps.

The states (:func:`verdict` decides once the job has stopped):

==============  ===================================================================================  =========
state           meaning                                                                              resumable
==============  ===================================================================================  =========
NOT_SUBMITTED   compiled, never submitted                                                            —
PENDING ...     the scheduler's live states (``PENDING``, ``RUNNING``, ``REQUEUED``, ``COMPLETING``)  —
COMPLETED       every step done: exit record 0 (without one: the newest committed checkpoint is the    no
                last step). The only state that means done; ``resume`` refuses, ``rollback`` works
TIMEOUT         stopped by its time limit: checkpointed just before it (exit record 75 near the      yes
                limit) or killed at it (Slurm's ``TIMEOUT``; locally, no record at the limit)
PREEMPTED       checkpointed on a preemption signal (exit record 75) and not requeued, or Slurm's   yes
                ``PREEMPTED``
PAUSED          stopped on request, by the watchdog or a user (exit record 76, ``control/PAUSED``)   yes
CANCELLED       cancelled (``hpcppo cancel``, ``scancel``, the watchdog monitor)                     yes
FAILED          exit record 1, a failing rank, or a job that ended with neither a record nor its     yes
                steps done
NODE_FAIL ...   Slurm's other final states (``NODE_FAIL``, ``OUT_OF_MEMORY``, ``BOOT_FAIL``,       yes
                ``DEADLINE``)
UNREADABLE      ``run.json`` cannot be read (the other runs are still listed)                        no
UNKNOWN         no source knows the job (purged, no accounting, scheduler unreachable)                —
==============  ===================================================================================  =========

A requeued Slurm job shows the scheduler's live state (``PENDING``, reason ``BeginTime``) and ``restarts``.
Resumable states name the checkpoint a resume starts from (``TIMEOUT (time limit 00:01:00; resumable,
checkpoint 120)``); the status dict says it in ``resumable``, ``exit_record`` and ``steps_done``.

No torch here (the login-node CLI uses this module), and no subprocesses: scheduler commands are run by
:mod:`hpcppo.launch.slurm`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import pickle
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hpcppo.errors import RunRecordError, SchedulerError
from hpcppo.launch import slurm
from hpcppo.launch.shell import script_run_dir
from hpcppo.launch.slurm import FINISHED_STATES
from hpcppo.rundir import RunDir, control, exitcodes, heartbeat
from hpcppo.rundir.checkpoints import latest_committed
from hpcppo.rundir.paths import RUN_JSON
from hpcppo.timefmt import format_elapsed


LOCAL_SIGNAL_DELAY_S = 30
"""The local executor's USR2 ("the time limit is near") comes this many seconds before its time limit."""
SLURM_SIGNAL_EARLY_S = 60
"""Slurm's ``--signal=USR2@lead`` "may be sent up to 60 seconds earlier than specified" (sbatch's manual)."""

FINAL_STATES = FINISHED_STATES | {"PAUSED"}
"""States after which the run's current job will not run again: Slurm's finished states, and ``PAUSED``
(stopped on request; ``hpcppo resume`` continues it). Besides these a status can be ``NOT_SUBMITTED``,
``UNREADABLE``, ``UNKNOWN``, or a live Slurm state (``PENDING``, ``RUNNING``, ``REQUEUED`` ...)."""

_NOTED_RESUMABLE = frozenset({"TIMEOUT", "PREEMPTED", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                              "DEADLINE"})  # fmt: skip
"""Final states whose reason ends with where a resume starts (for FAILED and PAUSED the reason is the story)."""

Status = dict[str, Any]


# ----------------------------------------------------------------------------- runs
def parse_time(text: str | None) -> _dt.datetime | None:
    """An ISO 8601 time of ``run.json`` (naive: UTC); None when missing or malformed."""
    if not text:
        return None
    try:
        t = _dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


def _run_meta(run: RunDir) -> dict[str, Any]:
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
            "world_size": plan.get("world_size", 1), "total_steps": plan.get("total_steps"),
            "time_limit_s": plan.get("time_limit_s"), "signal_lead_s": plan.get("signal_lead_s", 0),
            "time_limit": plan.get("time_limit"), "kind": job.get("kind", "train"),
            "watchdog": _watchdog_enabled(data)}


def _watchdog_enabled(resolved: dict[str, Any]) -> bool:
    """``experiment.watchdog.enable`` of a resolved.toml's data (its default, true, when not said)."""
    experiment = resolved.get("experiment")
    watchdog = experiment.get("watchdog") if isinstance(experiment, dict) else None
    return bool(watchdog.get("enable", True)) if isinstance(watchdog, dict) else True


def statuses(runs: Sequence[RunDir]) -> list[Status]:
    """Status of several runs with one batched scheduler query for all Slurm jobs.

    Each status has ``run_id``, ``path``, ``site``, ``scheduler``, ``attempts`` (how many submissions),
    ``job_id``, ``submitted_at``, ``state`` and ``reason`` (``PENDING``/``Priority``, ``FAILED``/the
    failing rank ...), ``elapsed_s``, ``restarts`` (Slurm requeues of the current job), ``source``
    (``sacct``, ``squeue``, ``scontrol``, ``local``, or ``run.json`` when only our record knows the
    outcome), ``latest_checkpoint``, ``total_steps``, ``steps_done``, ``exit_record`` and ``exit_reason`` (rank 0's verdict for
    the current job, or None), ``resumable`` and ``paused``. A final state seen here is written back into the
    attempt in ``run.json``, so it outlives the scheduler's memory of the job. A run whose ``run.json`` is
    unreadable is ``UNREADABLE`` with the reason, and does not stop the others from being listed.
    """
    return [st for st, _ in _statuses(runs)]


def _statuses(runs: Sequence[RunDir]) -> list[tuple[Status, dict[str, Any]]]:
    """:func:`statuses`, each with the ``run.json`` record it was decided on (a final state it saw written in)."""
    metas = {r.run_id: _run_meta(r) for r in runs}
    records: dict[str, dict[str, Any]] = {}
    unreadable: dict[str, str] = {}
    for r in runs:
        try:
            records[r.run_id] = r.read_record()
        except RunRecordError as exc:  # this run only: the others are still listed
            records[r.run_id], unreadable[r.run_id] = {"attempts": []}, str(exc)
    slurm_jobs: dict[str, _dt.datetime | None] = {}
    for r in runs:
        attempts = records[r.run_id].get("attempts", [])
        if attempts and metas[r.run_id]["scheduler"] == "slurm":
            last = attempts[-1]
            slurm_jobs[str(last["job_id"])] = parse_time(last.get("submitted_at"))
    infos: dict[str, Any] = {}
    query_error = None
    if slurm_jobs:
        try:
            # submitted_after: a record older than our submission is another job with a reused id.
            infos = slurm.query_jobs(list(slurm_jobs), submitted_after=slurm_jobs)
        except SchedulerError as exc:
            query_error = str(exc)
    out = []
    for r in runs:
        st = _one_status(r, metas[r.run_id], records[r.run_id], infos, query_error)
        if r.run_id in unreadable:
            st.update(state="UNREADABLE", reason=unreadable[r.run_id], source=RUN_JSON)
        else:
            _remember_final_state(r, records[r.run_id], st)
        out.append((st, records[r.run_id]))
    return out


def _one_status(run: RunDir, meta: dict[str, Any], record: dict[str, Any], infos: dict[str, Any],
                query_error: str | None) -> Status:  # fmt: skip
    attempts = record.get("attempts", [])
    latest = latest_committed(run.checkpoints)
    status = _blank_status(run, meta, len(attempts), latest)
    if not attempts:
        return status
    last = attempts[-1]
    status["job_id"] = str(last["job_id"])
    status["submitted_at"] = last.get("submitted_at")
    submitted = parse_time(last.get("submitted_at"))
    cancel_requested = last.get("cancel_requested_at")
    record_code: int | None = None
    record_key: str | None = None
    if meta["scheduler"] == "slurm":
        info = infos.get(status["job_id"])
        if info is not None and info.state != "UNKNOWN":
            status.update(state=info.state, reason=info.reason, elapsed_s=info.elapsed_s,
                          restarts=info.restart_count, source=info.source)  # fmt: skip
            record_key = slurm_attempt_key(run, status["job_id"], info.restart_count)
            record_code = exit_record(run, record_key)
        elif last.get("state") in FINAL_STATES:
            # Purged by the controller (MinJobAge) with no accounting to ask: our record still knows.
            status.update(state=last["state"], source=RUN_JSON,
                          reason=f"as recorded at {last.get('state_seen_at', '?')}; the scheduler no longer knows the job")
            status["resumable"] = last["state"] != "COMPLETED"
            record_key = slurm_attempt_key(run, status["job_id"], None)
            status["exit_record"] = exit_record(run, record_key)
            status["exit_reason"] = exitcodes.read_exit_reason(run.path, record_key)
            return status
        else:
            status.update(state="UNKNOWN", source="none",
                          reason=query_error or "not known to the scheduler (purged from its memory and no accounting?)")
        at_limit = _near(status["elapsed_s"], meta["time_limit_s"], (meta["signal_lead_s"] or 0) + SLURM_SIGNAL_EARLY_S)
    else:
        record_key = f"local-{status['job_id']}"
        record_code = _local_status(run, meta, status, record_key, submitted, cancel_requested)
        at_limit = _near(status["elapsed_s"], meta["time_limit_s"], LOCAL_SIGNAL_DELAY_S)
    status["exit_record"] = record_code
    status["exit_reason"] = exitcodes.read_exit_reason(run.path, record_key) if record_key else None
    if status["state"] not in FINAL_STATES | {"UNKNOWN"}:
        if status["state"] == "RUNNING" and meta["watchdog"] and record_key:
            status["monitor"] = monitor_liveness(run, record_key, status["elapsed_s"])
        return status  # live: the scheduler's word
    if status["state"] == "UNKNOWN" and record_code is None and not status["paused"]:
        return status
    state, reason = verdict(status["state"], status["reason"], record_code, scheduler=meta["scheduler"],
                            cancel_requested=cancel_requested, at_time_limit=at_limit,
                            steps_done=status["steps_done"], kind=meta["kind"], time_limit=meta["time_limit"],
                            paused_reason=control.paused_reason(run) if status["paused"] else None,
                            record_reason=status["exit_reason"])
    status.update(state=state, reason=reason, resumable=state != "COMPLETED")
    if state in _NOTED_RESUMABLE:
        where = f"resumable, checkpoint {latest}" if latest is not None else "resumable, no checkpoint yet: starts over"
        status["reason"] = f"{reason}; {where}" if reason else where
    if status["moved_from"]:
        # A copy: what its jobs did after the copy was made went to the directory its script names, not here.
        moved = f"a copy: job.sbatch runs in {status['moved_from']} (hpcppo resume renders it for this directory)"
        status["reason"] = f"{status['reason']}; {moved}" if status["reason"] else moved
    return status


def _blank_status(run: RunDir, meta: dict[str, Any], attempts: int, latest: int | None) -> Status:
    """What a run's status is before its jobs are asked about: NOT_SUBMITTED, its checkpoints and control files."""
    total = meta["total_steps"]
    status: Status = {
        "run_id": run.run_id,
        "path": str(run.path),
        "site": meta["site"],
        "scheduler": meta["scheduler"],
        "attempts": attempts,
        "job_id": None,
        "submitted_at": None,
        "state": "NOT_SUBMITTED",
        "reason": None,
        "elapsed_s": None,
        "restarts": None,
        "source": None,
        "latest_checkpoint": latest,
        "total_steps": total,
        "steps_done": meta["kind"] == "train" and isinstance(total, int) and latest is not None and latest >= total,
        "exit_record": None,
        "exit_reason": None,
        "resumable": False,
        "paused": control.is_paused(run),
        "moved_from": script_elsewhere(run),
        "monitor": None,  # a running attempt's watchdog monitor (monitor_liveness); None: not asked
    }
    return status


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


def _local_status(run: RunDir, meta: dict[str, Any], status: Status, record_key: str,
                  submitted: _dt.datetime | None, cancel_requested: str | None) -> int | None:
    """A local job's state, reason and elapsed time into ``status``; returns its exit code as recorded (rank 0's
    exit record, or what rank 0's job script returned through submitit once the job is over)."""
    local = local_job_info(run, status["job_id"], int(meta["world_size"]))
    status.update(state=local["state"], reason=local["reason"], source="local")
    record_code = exit_record(run, record_key)
    if record_code is None and local["state"] != "RUNNING":
        record_code = local["codes"].get(0)  # rank 0's job script returned it through submitit
    if submitted is not None:
        end = _dt.datetime.now(_dt.timezone.utc).timestamp() if local["state"] == "RUNNING" else local["ended_at"]
        if end is None and cancel_requested:
            end = (parse_time(cancel_requested) or submitted).timestamp()
        if end is not None:
            status["elapsed_s"] = max(0.0, end - submitted.timestamp())
    return record_code

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


def _near(elapsed_s: float | None, limit_s: Any, lead_s: float) -> bool:
    """Whether a job that ran ``elapsed_s`` had reached the point where its time limit's warning comes."""
    if elapsed_s is None or not isinstance(limit_s, (int, float)):
        return False
    return elapsed_s >= limit_s - lead_s - 5.0


# Final Slurm states that say the job's hardware went away under it, whatever the trainers recorded on the way out.
_LOST_HARDWARE = {"NODE_FAIL": "a node of the job failed", "BOOT_FAIL": "a node of the job failed to boot",
                  "OUT_OF_MEMORY": "the job ran out of memory"}


def _lost_hardware(state: str, scheduler_reason: str | None) -> str:
    return _LOST_HARDWARE[state] + (f" ({scheduler_reason})" if scheduler_reason else "")


def verdict(scheduler_state: str, scheduler_reason: str | None, record: int | None, *, scheduler: str = "slurm",
            cancel_requested: str | None = None, at_time_limit: bool = False, steps_done: bool = False,
            kind: str = "train", time_limit: str | None = None,
            paused_reason: str | None = None, record_reason: str | None = None) -> tuple[str, str | None]:  # fmt: skip
    """The state of a stopped job, and why: the scheduler's final state (or ``UNKNOWN``) read together with the
    job's own exit record (:mod:`hpcppo.rundir.exitcodes`; None when there is none). Pure: tested on literal records.

    ``cancel_requested`` is when a user asked to cancel (run.json), ``at_time_limit`` whether the job ran until
    its time limit's warning, ``steps_done`` whether the newest committed checkpoint is the last step,
    ``paused_reason`` the text of ``control/PAUSED`` when it exists, ``record_reason`` the explanation rank 0 wrote
    with its exit record (a diagnosed failure: a full disk ...).
    """
    limit = f"time limit {time_limit}" if time_limit else "time limit"
    if record == exitcodes.DONE:
        return "COMPLETED", None
    if record == exitcodes.PAUSED or paused_reason is not None and record is None:
        return "PAUSED", paused_reason or "paused on request"
    cancelled = scheduler_state == "CANCELLED" or cancel_requested is not None
    if record == exitcodes.REQUEUE:
        if cancelled:
            when = f"cancel requested at {cancel_requested}" if cancel_requested else "cancelled"
            return "CANCELLED", f"{when}; checkpointed on the way out"
        if scheduler_state == "TIMEOUT" or at_time_limit:
            return "TIMEOUT", f"{limit}: checkpointed before it"
        if scheduler_state in _LOST_HARDWARE:  # Slurm signals a dead node's tasks too: why it stopped is the node
            return scheduler_state, f"{_lost_hardware(scheduler_state, scheduler_reason)}; checkpointed on the way out"
        if scheduler == "slurm" and scheduler_state != "PREEMPTED":
            return "PREEMPTED", "checkpointed on a preemption signal; the job was not requeued"
        return "PREEMPTED", "checkpointed on a preemption signal"
    if scheduler_state in _LOST_HARDWARE and record in (exitcodes.FAILED, None):  # killed with the node, or not
        return scheduler_state, _lost_hardware(scheduler_state, scheduler_reason)
    if record == exitcodes.FAILED:
        if scheduler_state in FINISHED_STATES - {"COMPLETED", "FAILED"}:
            return scheduler_state, scheduler_reason
        return "FAILED", record_reason or scheduler_reason or "rank 0 recorded a failure (see the logs)"
    if record is not None:  # a code the job entry point never writes: a signal or a shell error
        return "FAILED", f"exit record {record}" + (f"; {scheduler_reason}" if scheduler_reason else "")
    # No exit record: the scheduler's state, checked against the run.
    if scheduler_state == "COMPLETED":
        if steps_done or kind != "train":
            return "COMPLETED", None
        return "FAILED", "the job ended without rank 0's exit record and before its last step"
    if cancelled:
        return "CANCELLED", f"cancel requested at {cancel_requested}" if cancel_requested else scheduler_reason
    if scheduler == "local" and at_time_limit and scheduler_state in ("FAILED", "UNKNOWN"):
        return "TIMEOUT", f"{limit}: stopped by the local executor"
    if scheduler_state == "TIMEOUT":
        return "TIMEOUT", f"{limit}: killed at it"
    return scheduler_state, scheduler_reason


def exit_record(run: RunDir, attempt_key: str) -> int | None:
    """The code in ``control/exit-code.<attempt_key>`` (None when missing or not a number)."""
    return exitcodes.read_exit_record(run.path, attempt_key)


def slurm_attempt_key(run: RunDir, job_id: str, restarts: int | None) -> str:
    """``<job>.<restart>`` as the batch script names this run of the job (``HPCPPO_ATTEMPT``); with the restart
    count unknown, the newest run that left a record."""
    if restarts is not None:
        return f"{job_id}.{restarts}"
    found = run.exit_records_of(job_id)
    return f"{job_id}.{max(found) if found else 0}"


def _remember_final_state(run: RunDir, record: dict[str, Any], status: Status) -> None:
    """Write a final state the scheduler reported into the run's last attempt, on disk and in ``record`` (best
    effort: a run directory we may not write, e.g. a colleague's, is only read)."""
    attempts = record.get("attempts", [])
    if (not attempts or status["source"] in (None, "none", RUN_JSON) or status["state"] not in FINAL_STATES
            or attempts[-1].get("state") == status["state"]):  # fmt: skip
        return
    seen = {"state": status["state"], "state_seen_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    try:
        if run.update_attempt(status["job_id"], **seen):
            attempts[-1].update(seen)
    except OSError:
        pass


def run_status(run: RunDir) -> Status:
    return statuses([run])[0]


def run_detail(run: RunDir) -> tuple[Status, list[dict[str, Any]]]:
    """:func:`run_status` and the attempts of ``run.json`` it was decided on: one read of the record for both."""
    st, record = _statuses([run])[0]
    return st, record.get("attempts", [])


def wait_for(run: RunDir, *, poll_s: float = 2.0, timeout_s: float | None = None,
             echo: Callable[[Status], None] | None = None, unknown_grace_s: float = 300.0) -> Status:
    """Poll :func:`run_status` until the last attempt reaches a final state.

    Returns early after ``timeout_s``, or when the scheduler has not known the job for ``unknown_grace_s``
    in a row (it was purged and there is no accounting: waiting longer would never end).
    """
    start = time.monotonic()
    unknown_since: float | None = None
    while True:
        st = run_status(run)
        if echo:
            echo(st)
        if st["state"] in FINAL_STATES:
            return st
        now = time.monotonic()
        unknown_since = (unknown_since or now) if st["state"] == "UNKNOWN" else None
        if unknown_since is not None and now - unknown_since > unknown_grace_s:
            return st
        if timeout_s is not None and now - start > timeout_s:
            return st
        time.sleep(poll_s)


# ----------------------------------------------------------------------------- local jobs (submitit's LocalExecutor)
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


def local_job_info(run: RunDir, job_id: str, ntasks: int) -> dict[str, Any]:
    """State of a local-executor job from its controller process and submitit's result files.

    Returns ``state`` (``RUNNING``, ``COMPLETED``, ``FAILED`` or ``CANCELLED``: what the processes did, before
    :func:`verdict` reads the exit record), ``reason`` (the failing rank's last error line, or why a run looks
    cancelled), ``codes`` (rank -> the job script's exit code, for ranks that returned one) and ``ended_at``
    (POSIX time of the last result file, for the elapsed time; ``None`` while running).

    The failing rank named is the one that failed first: a rank ended by a signal (a kill), else the earliest
    result file. A rank that dies takes its peers down with it (their collectives fail), and naming rank 0 for
    every failure would hide which rank was killed.
    """
    # submitit has no public way to name a task's result file without registering a Job with its watcher.
    from submitit.core.utils import JobPaths

    if local_controller_alive(job_id, run.submitit):
        return {"state": "RUNNING", "reason": None, "codes": {}, "ended_at": None}
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
        return {"state": "COMPLETED", "reason": None, "codes": codes, "ended_at": ended_at}
    if errors:
        _, _, rank, line = min(errors)
        others = f" ({len(errors) - 1} other rank(s) failed after it)" if len(errors) > 1 else ""
        return {"state": "FAILED", "reason": f"rank {rank}: {line}{others}", "codes": codes, "ended_at": ended_at}
    missing = [str(t) for t, o in enumerate(outcomes) if o != "success"]
    return {"state": "CANCELLED", "reason": f"controller gone; no result from rank(s) {', '.join(missing)}",
            "codes": codes, "ended_at": ended_at}


# ----------------------------------------------------------------------------- text for the CLI


def state_text(st: Status) -> str:
    """``STATE`` or ``STATE (reason)``."""
    return f"{st['state']} ({st['reason']})" if st.get("reason") and st["reason"] not in ("None",) else st["state"]


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def format_run(st: Status, attempts: Sequence[dict[str, Any]], events: Sequence[dict[str, Any]] = ()) -> str:
    """The detail of one run (``hpcppo status RUN``): its status, one line per attempt of ``run.json``, then the
    last ``events`` (watchdog actions, rollback requests, monitor findings from ``events.jsonl``)."""
    source = f"   [from {st['source']}]" if st.get("source") else ""
    lines = [f"run         {st['run_id']}",
             f"site        {st['site']} ({st['scheduler']})",
             f"job         {st['job_id'] or '-'}",
             f"state       {state_text(st)}{source}",
             f"elapsed     {format_elapsed(st['elapsed_s'])}",
             f"attempts    {st['attempts']}",
             f"restarts    {_dash(st['restarts'])}",
             f"checkpoint  {_dash(st['latest_checkpoint'])}",
             f"directory   {st['path']}"]
    if st.get("monitor"):
        lines.append(f"monitor     {st['monitor']}")
    if st.get("moved_from"):
        lines.append(f"copied from {st['moved_from']} (job.sbatch runs there; hpcppo resume renders it for here)")
    for i, a in enumerate(attempts):
        seen = f", last seen {a['state']}" if a.get("state") else ""
        lines.append(f"attempt {i}: job {a.get('job_id')} submitted {a.get('submitted_at')} ({a.get('kind', 'submit')}{seen})")
    if events:
        lines.append(f"last {len(events)} events (events.jsonl):")
        for e in events:
            step = "-" if e.get("step") is None else e["step"]
            lines.append(f"  {str(e.get('time', ''))[:19]}  step {step:>5}  {e.get('kind', '?'):<24} {e.get('message', '')}")
    return "\n".join(lines)
