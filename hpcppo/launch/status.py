"""Job status, in one place: the states, what the scheduler and the run's own records say, and the text the CLI prints.

A run's status is one dict (see :func:`statuses`) built from three sources:

* Slurm, through :func:`hpcppo.launch.slurm.query_jobs` (one batched ``sacct``, then ``squeue``);
* a local run's submitit controller process and result files (:func:`local_job_info`);
* the run directory: ``run.json`` (the attempts, and the last final state seen, which outlives the
  scheduler's memory of a job), ``control/PAUSED`` and the committed checkpoints.

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

from hpcppo.distributed.layout import latest_committed
from hpcppo.launch.rundir import RunDir, list_runs
from hpcppo.launch.slurm import FINISHED_STATES

SUBMITIT_DIR = "submitit"
"""submitit's folder inside a run directory (submission files, logs, result pickles)."""

FINAL_STATES = FINISHED_STATES | {"PAUSED"}
"""States after which the run's current job will not run again: Slurm's finished states, and ``PAUSED``
(stopped on request; ``hpcppo resume`` continues it). Besides these a status can be ``NOT_SUBMITTED``,
``UNKNOWN``, or a live Slurm state (``PENDING``, ``RUNNING``, ``REQUEUED`` ...)."""

Status = dict[str, Any]


# ----------------------------------------------------------------------------- runs
def _parse_time(text: str | None) -> _dt.datetime | None:
    if not text:
        return None
    try:
        t = _dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


def _run_meta(run: RunDir) -> dict[str, Any]:
    """Site and scheduler of a run from its resolved.toml, without building the config objects."""
    import tomllib

    try:
        data = tomllib.loads(run.resolved.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {"site": "?", "scheduler": "?", "world_size": 1}
    site = data.get("site", {})
    plan = data.get("plan", {})
    return {"site": site.get("name", "?"), "scheduler": site.get("scheduler", "?"), "world_size": plan.get("world_size", 1)}


def statuses(runs: Sequence[RunDir]) -> list[Status]:
    """Status of several runs with one batched scheduler query for all Slurm jobs.

    Each status has ``run_id``, ``path``, ``site``, ``scheduler``, ``attempts`` (how many submissions),
    ``job_id``, ``submitted_at``, ``state`` and ``reason`` (``PENDING``/``Priority``, ``FAILED``/the
    failing rank ...), ``elapsed_s``, ``restarts`` (Slurm requeues of the current job), ``source``
    (``sacct``, ``squeue``, ``scontrol``, ``local``, or ``run.json`` when only our record knows the
    outcome), ``latest_checkpoint`` and ``paused``. A final state seen here is written back into the
    attempt in ``run.json``, so it outlives the scheduler's memory of the job.
    """
    metas = {r.run_id: _run_meta(r) for r in runs}
    records = {r.run_id: r.read_record() for r in runs}
    slurm_jobs: dict[str, _dt.datetime | None] = {}
    for r in runs:
        attempts = records[r.run_id].get("attempts", [])
        if attempts and metas[r.run_id]["scheduler"] == "slurm":
            last = attempts[-1]
            slurm_jobs[str(last["job_id"])] = _parse_time(last.get("submitted_at"))
    infos: dict[str, Any] = {}
    query_error = None
    if slurm_jobs:
        from hpcppo.errors import SchedulerError
        from hpcppo.launch import slurm

        try:
            # submitted_after: a record older than our submission is another job with a reused id.
            infos = slurm.query_jobs(list(slurm_jobs), submitted_after=slurm_jobs)
        except SchedulerError as exc:
            query_error = str(exc)
    out = []
    for r in runs:
        st = _one_status(r, metas[r.run_id], records[r.run_id], infos, query_error)
        _remember_final_state(r, records[r.run_id], st)
        out.append(st)
    return out


def _one_status(run: RunDir, meta: dict[str, Any], record: dict[str, Any], infos: dict[str, Any],
                query_error: str | None) -> Status:  # fmt: skip
    attempts = record.get("attempts", [])
    status: Status = {
        "run_id": run.run_id,
        "path": str(run.path),
        "site": meta["site"],
        "scheduler": meta["scheduler"],
        "attempts": len(attempts),
        "job_id": None,
        "submitted_at": None,
        "state": "NOT_SUBMITTED",
        "reason": None,
        "elapsed_s": None,
        "restarts": None,
        "source": None,
        "latest_checkpoint": latest_committed(run.checkpoints),
        "paused": (run.control / "PAUSED").exists(),
    }
    if not attempts:
        return status
    last = attempts[-1]
    status["job_id"] = str(last["job_id"])
    status["submitted_at"] = last.get("submitted_at")
    submitted = _parse_time(last.get("submitted_at"))
    if meta["scheduler"] == "slurm":
        info = infos.get(status["job_id"])
        if info is not None and info.state != "UNKNOWN":
            status.update(state=info.state, reason=info.reason, elapsed_s=info.elapsed_s,
                          restarts=info.restart_count, source=info.source)  # fmt: skip
        elif last.get("state") in FINAL_STATES:
            # Purged by the controller (MinJobAge) with no accounting to ask: our record still knows.
            status.update(state=last["state"], source="run.json",
                          reason=f"as recorded at {last.get('state_seen_at', '?')}; the scheduler no longer knows the job")
        else:
            status.update(state="UNKNOWN", source="none",
                          reason=query_error or "not known to the scheduler (purged from its memory and no accounting?)")
    else:
        local = local_job_info(run, status["job_id"], int(meta["world_size"]))
        status.update(state=local["state"], reason=local["reason"], source="local")
        cancelled_at = _parse_time(last.get("cancel_requested_at"))
        if local["state"] == "CANCELLED" and cancelled_at is not None:
            status["reason"] = f"cancel requested at {last['cancel_requested_at']}"
        if submitted is not None:
            end = _dt.datetime.now(_dt.timezone.utc).timestamp() if local["state"] == "RUNNING" else local["ended_at"]
            if end is None and cancelled_at is not None:
                end = cancelled_at.timestamp()
            if end is not None:
                status["elapsed_s"] = max(0.0, end - submitted.timestamp())
    if status["paused"] and status["state"] in FINAL_STATES | {"UNKNOWN"}:
        status["state"] = "PAUSED"
        with contextlib.suppress(OSError):
            status["reason"] = (run.control / "PAUSED").read_text().strip() or status["reason"]
    return status


def _remember_final_state(run: RunDir, record: dict[str, Any], status: Status) -> None:
    """Write a final state the scheduler reported into the run's last attempt (best effort: a run
    directory we may not write, e.g. a colleague's, is only read)."""
    attempts = record.get("attempts", [])
    if (not attempts or status["source"] in (None, "none", "run.json") or status["state"] not in FINAL_STATES
            or attempts[-1].get("state") == status["state"]):  # fmt: skip
        return
    seen = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    try:
        run.update_attempt(status["job_id"], state=status["state"], state_seen_at=seen)
    except OSError:
        pass


def run_status(run: RunDir) -> Status:
    return statuses([run])[0]


def all_statuses(runs_root: Path) -> list[Status]:
    return statuses(list_runs(runs_root))


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

    Returns ``state`` (``RUNNING``, ``COMPLETED``, ``FAILED`` or ``CANCELLED``), ``reason`` (the
    failing rank's last error line, or why a run looks cancelled) and ``ended_at`` (POSIX time of the
    last result file, for the elapsed time; ``None`` while running).
    """
    # submitit has no public way to name a task's result file without registering a Job with its watcher.
    from submitit.core.utils import JobPaths

    if local_controller_alive(job_id, run.path / SUBMITIT_DIR):
        return {"state": "RUNNING", "reason": None, "ended_at": None}
    outcomes, reason, ended_at = [], None, None
    for task in range(ntasks):
        path = JobPaths(run.path / SUBMITIT_DIR, job_id=job_id, task_id=task).result_pickle
        outcome, payload = _local_outcome(path)
        outcomes.append(outcome)
        if outcome != "missing":
            with contextlib.suppress(OSError):
                ended_at = max(ended_at or 0.0, path.stat().st_mtime)
        if outcome == "error" and reason is None:
            lines = [ln.strip() for ln in str(payload).strip().splitlines() if ln.strip()]
            reason = f"rank {task}: {lines[-1] if lines else 'failed'}"
    if outcomes and all(o == "success" for o in outcomes):
        return {"state": "COMPLETED", "reason": None, "ended_at": ended_at}
    if "error" in outcomes:
        return {"state": "FAILED", "reason": reason, "ended_at": ended_at}
    missing = [str(t) for t, o in enumerate(outcomes) if o != "success"]
    return {"state": "CANCELLED", "reason": f"controller gone; no result from rank(s) {', '.join(missing)}",
            "ended_at": ended_at}


# ----------------------------------------------------------------------------- text for the CLI
TABLE_COLUMNS = ("run", "site", "job", "state", "attempts", "elapsed", "ckpt")


def format_elapsed(seconds: float | None) -> str:
    """``H:MM:SS``, or ``-`` when unknown."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}"


def state_text(st: Status) -> str:
    """``STATE`` or ``STATE (reason)``."""
    return f"{st['state']} ({st['reason']})" if st.get("reason") and st["reason"] not in ("None",) else st["state"]


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def table_row(st: Status) -> tuple[str, ...]:
    """One row of the run list, in :data:`TABLE_COLUMNS` order."""
    return (st["run_id"], st["site"], str(st["job_id"] or "-"), state_text(st), str(st["attempts"]),
            format_elapsed(st["elapsed_s"]), _dash(st["latest_checkpoint"]))


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
    for i, a in enumerate(attempts):
        seen = f", last seen {a['state']}" if a.get("state") else ""
        lines.append(f"attempt {i}: job {a.get('job_id')} submitted {a.get('submitted_at')} ({a.get('kind', 'submit')}{seen})")
    if events:
        lines.append(f"last {len(events)} events (events.jsonl):")
        for e in events:
            step = "-" if e.get("step") is None else e["step"]
            lines.append(f"  {str(e.get('time', ''))[:19]}  step {step:>5}  {e.get('kind', '?'):<24} {e.get('message', '')}")
    return "\n".join(lines)
