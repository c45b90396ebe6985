"""Job status: the states, and a run's :class:`JobStatus` decided from the scheduler's word and the run's own records.

A run's status is one frozen :class:`JobStatus` (see :func:`statuses`) built from these sources:

* Slurm, through :func:`hpcppo.launch.slurm.query_jobs` (one batched ``sacct``, then ``squeue``);
* a local run's submitit controller process and result files (:func:`hpcppo.launch.runrecords.local_job_info`);
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
checkpoint 120)``); the status says it in ``resumable``, ``exit_record`` and ``steps_done``.

The run's own records are read by :mod:`hpcppo.launch.runrecords` (once per run: :func:`~hpcppo.launch.runrecords.
read_facts`); the text the CLI prints is :mod:`hpcppo.launch.statustext`. No torch here (the login-node CLI uses
this module), and no subprocesses: scheduler commands are run by :mod:`hpcppo.launch.slurm`.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from hpcppo.errors import SchedulerError
from hpcppo.launch import runrecords, slurm
from hpcppo.launch.runrecords import RunFacts, attempt_exit, parse_time, slurm_attempt_key
from hpcppo.launch.slurm import FINISHED_STATES
from hpcppo.rundir import RunDir, exitcodes
from hpcppo.rundir.paths import RUN_JSON


LOCAL_SIGNAL_DELAY_S = 30
"""The local executor's USR2 ("the time limit is near") comes this many seconds before its time limit."""
SLURM_SIGNAL_EARLY_S = 60
"""Slurm's ``--signal=USR2@lead`` "may be sent up to 60 seconds earlier than specified" (sbatch's manual)."""
JUST_SUBMITTED_S = 120.0
"""An attempt this recent that the scheduler does not know yet (accounting lags ``sbatch``) is taken to be live."""

FINAL_STATES = FINISHED_STATES | {"PAUSED"}
"""States after which the run's current job will not run again: Slurm's finished states, and ``PAUSED``
(stopped on request; ``hpcppo resume`` continues it). Besides these a status can be ``NOT_SUBMITTED``,
``UNREADABLE``, ``UNKNOWN``, or a live Slurm state (``PENDING``, ``RUNNING``, ``REQUEUED`` ...)."""

_NOTED_RESUMABLE = frozenset({"TIMEOUT", "PREEMPTED", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                              "DEADLINE"})  # fmt: skip
"""Final states whose reason ends with where a resume starts (for FAILED and PAUSED the reason is the story)."""


@attrs.frozen(kw_only=True)
class JobStatus:
    """A run's job status (:func:`statuses`). ``hpcppo status --json`` prints its fields in this order."""

    run_id: str
    path: str  # the run directory
    site: str
    scheduler: str  # "slurm", "local"; "?" when resolved.toml cannot be read
    attempts: int  # how many submissions run.json records
    job_id: str | None = None  # the current (last) attempt's job
    submitted_at: str | None = None  # ISO 8601, as run.json has it
    state: str = "NOT_SUBMITTED"
    reason: str | None = None  # PENDING: Priority; FAILED: the failing rank ...
    elapsed_s: float | None = None
    restarts: int | None = None  # Slurm requeues of the current job
    source: str | None = None  # sacct, squeue, scontrol, local, run.json (only our record knows), none
    latest_checkpoint: int | None = None
    total_steps: int | None = None
    steps_done: bool = False  # the newest committed checkpoint is the last step (a train job)
    exit_record: int | None = None  # rank 0's exit record for the current job
    exit_reason: str | None = None  # the explanation written with it (a diagnosed failure)
    resumable: bool = False
    paused: bool = False  # control/PAUSED exists
    moved_from: str | None = None  # the directory job.sbatch runs in when it is not this one (a copy)
    monitor: str | None = None  # a running attempt's watchdog monitor (runrecords.monitor_liveness); None: not asked
    roles: str = ""  # the ranks' roles (runrecords.RunFacts.roles): colocated, or split's trainer and rollout ranks

    def to_dict(self) -> dict[str, Any]:
        """The fields, in order: what ``status --json`` and ``runs --json`` print."""
        return attrs.asdict(self, recurse=False)

    @property
    def final(self) -> bool:
        """The current job will not run again (:data:`FINAL_STATES`)."""
        return self.state in FINAL_STATES

    def stopped(self, *, now: _dt.datetime | None = None) -> bool:
        """Whether the run's job has stopped (or never ran), so a new attempt may start: a final state,
        NOT_SUBMITTED, or UNKNOWN unless it was submitted moments ago (:data:`JUST_SUBMITTED_S`: accounting and the
        controller may not answer for it yet)."""
        if self.state not in FINAL_STATES | {"NOT_SUBMITTED", "UNKNOWN"}:
            return False
        submitted = parse_time(self.submitted_at) if self.state == "UNKNOWN" else None
        now = now or _dt.datetime.now(_dt.timezone.utc)
        return submitted is None or (now - submitted).total_seconds() >= JUST_SUBMITTED_S


# ----------------------------------------------------------------------------- runs
def statuses(runs: Sequence[RunDir]) -> list[JobStatus]:
    """Status of several runs with one batched scheduler query for all Slurm jobs.

    A final state seen here is written back into the attempt in ``run.json``, so it outlives the scheduler's
    memory of the job. A run whose ``run.json`` is unreadable is ``UNREADABLE`` with the reason, and does not stop
    the others from being listed.
    """
    return [st for st, _ in _statuses(runs)]


def run_status(run: RunDir) -> JobStatus:
    """:func:`statuses` of one run: everything ``resume``, ``cancel`` and ``rollback`` decide on."""
    return statuses([run])[0]


def run_detail(run: RunDir) -> tuple[JobStatus, list[dict[str, Any]]]:
    """:func:`run_status` and the attempts of ``run.json`` it was decided on: one read of the record for both."""
    st, facts = _statuses([run])[0]
    return st, facts.attempts


def _statuses(runs: Sequence[RunDir]) -> list[tuple[JobStatus, RunFacts]]:
    """:func:`statuses`, each with the run's records it was decided on (a final state it saw written in)."""
    facts = {r.run_id: runrecords.read_facts(r) for r in runs}
    slurm_jobs: dict[str, _dt.datetime | None] = {}
    for f in facts.values():
        if f.attempts and f.scheduler == "slurm":
            slurm_jobs[str(f.attempts[-1]["job_id"])] = parse_time(f.attempts[-1].get("submitted_at"))
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
        f = facts[r.run_id]
        st = _one_status(r, f, infos, query_error)
        if f.unreadable is not None:
            st = attrs.evolve(st, state="UNREADABLE", reason=f.unreadable, source=RUN_JSON)
        elif st.job_id is not None and st.source not in (None, "none", RUN_JSON) and st.final:
            runrecords.remember_final_state(r, f.record, st.job_id, st.state)
        out.append((st, f))
    return out


def _blank_status(run: RunDir, f: RunFacts) -> JobStatus:
    """What a run's status is before its jobs are asked about: NOT_SUBMITTED, its checkpoints and control files."""
    total, latest = f.total_steps, f.latest_checkpoint
    return JobStatus(run_id=run.run_id, path=str(run.path), site=f.site, scheduler=f.scheduler,
                     attempts=len(f.attempts), latest_checkpoint=latest, total_steps=total,
                     steps_done=f.kind == "train" and isinstance(total, int) and latest is not None and latest >= total,
                     paused=f.paused, moved_from=f.moved_from, roles=f.roles)  # fmt: skip


def _one_status(run: RunDir, f: RunFacts, infos: dict[str, Any], query_error: str | None) -> JobStatus:
    st = _blank_status(run, f)
    if not f.attempts:
        return st
    last = f.attempts[-1]
    job_id = str(last["job_id"])
    st = attrs.evolve(st, job_id=job_id, submitted_at=last.get("submitted_at"))
    cancel_requested = last.get("cancel_requested_at")
    record_key: str | None = None
    record_code = record_reason = None
    if f.scheduler == "slurm":
        info = infos.get(job_id)
        if info is not None and info.state != "UNKNOWN":
            st = attrs.evolve(st, state=info.state, reason=info.reason, elapsed_s=info.elapsed_s,
                              restarts=info.restart_count, source=info.source)  # fmt: skip
            record_key = slurm_attempt_key(run, job_id, info.restart_count)
            record_code, record_reason = attempt_exit(run, record_key)
        elif last.get("state") in FINAL_STATES:
            # Purged by the controller (MinJobAge) with no accounting to ask: our record still knows.
            code, why = attempt_exit(run, slurm_attempt_key(run, job_id, None))
            return attrs.evolve(st, state=last["state"], source=RUN_JSON, resumable=last["state"] != "COMPLETED",
                                reason=f"as recorded at {last.get('state_seen_at', '?')}; the scheduler no longer "
                                       f"knows the job", exit_record=code, exit_reason=why)  # fmt: skip
        else:
            st = attrs.evolve(st, state="UNKNOWN", source="none",
                              reason=query_error or "not known to the scheduler (purged from its memory and no "
                                                    "accounting?)")  # fmt: skip
        at_limit = _near(st.elapsed_s, f.time_limit_s, (f.signal_lead_s or 0) + SLURM_SIGNAL_EARLY_S)
    else:
        record_key = f"local-{job_id}"
        st, record_code, record_reason = _local_status(run, f, st, record_key, cancel_requested)
        at_limit = _near(st.elapsed_s, f.time_limit_s, LOCAL_SIGNAL_DELAY_S)
    st = attrs.evolve(st, exit_record=record_code, exit_reason=record_reason)
    if st.state not in FINAL_STATES | {"UNKNOWN"}:
        if st.state == "RUNNING" and f.watchdog and record_key:
            st = attrs.evolve(st, monitor=runrecords.monitor_liveness(run, record_key, st.elapsed_s))
        return st  # live: the scheduler's word
    if st.state == "UNKNOWN" and record_code is None and not st.paused:
        return st
    return _decided(st, f, cancel_requested=cancel_requested, at_limit=at_limit)


def _decided(st: JobStatus, f: RunFacts, *, cancel_requested: str | None, at_limit: bool) -> JobStatus:
    """A stopped job's status: :func:`verdict`, where a resume starts, and a copied run's note."""
    state, reason = verdict(st.state, st.reason, st.exit_record, scheduler=f.scheduler,
                            cancel_requested=cancel_requested, at_time_limit=at_limit, steps_done=st.steps_done,
                            kind=f.kind, time_limit=f.time_limit, paused_reason=f.paused_reason if st.paused else None,
                            record_reason=st.exit_reason)  # fmt: skip
    if state in _NOTED_RESUMABLE:
        latest = st.latest_checkpoint
        where = f"resumable, checkpoint {latest}" if latest is not None else "resumable, no checkpoint yet: starts over"
        reason = f"{reason}; {where}" if reason else where
    if st.moved_from:
        # A copy: what its jobs did after the copy was made went to the directory its script names, not here.
        moved = f"a copy: job.sbatch runs in {st.moved_from} (hpcppo resume renders it for this directory)"
        reason = f"{reason}; {moved}" if reason else moved
    return attrs.evolve(st, state=state, reason=reason, resumable=state != "COMPLETED")


def _local_status(run: RunDir, f: RunFacts, st: JobStatus, record_key: str,
                  cancel_requested: str | None) -> tuple[JobStatus, int | None, str | None]:  # fmt: skip
    """A local job's state, reason and elapsed time, with its exit code as recorded (rank 0's exit record, or what
    rank 0's job script returned through submitit once the job is over) and the record's explanation."""
    assert st.job_id is not None
    local = runrecords.local_job_info(run, st.job_id, int(f.world_size))
    record_code, record_reason = attempt_exit(run, record_key)
    if record_code is None and local.state != "RUNNING":
        record_code = local.codes.get(0)  # rank 0's job script returned it through submitit
    elapsed = None
    submitted = parse_time(st.submitted_at)
    if submitted is not None:
        end = _dt.datetime.now(_dt.timezone.utc).timestamp() if local.state == "RUNNING" else local.ended_at
        if end is None and cancel_requested:
            end = (parse_time(cancel_requested) or submitted).timestamp()
        if end is not None:
            elapsed = max(0.0, end - submitted.timestamp())
    return attrs.evolve(st, state=local.state, reason=local.reason, source="local", elapsed_s=elapsed), \
        record_code, record_reason


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


def wait_for(run: RunDir, *, poll_s: float = 2.0, timeout_s: float | None = None,
             echo: Callable[[JobStatus], None] | None = None, unknown_grace_s: float = 300.0) -> JobStatus:
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
        if st.final:
            return st
        now = time.monotonic()
        unknown_since = (unknown_since or now) if st.state == "UNKNOWN" else None
        if unknown_since is not None and now - unknown_since > unknown_grace_s:
            return st
        if timeout_s is not None and now - start > timeout_s:
            return st
        time.sleep(poll_s)
