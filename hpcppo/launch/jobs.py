"""What the CLI does, as a library: compile, submit, preflight, status, cancel.

Everything here runs on a login node: no torch import (a test checks ``sys.modules``). Scheduler
commands go through :mod:`hpcppo.launch.slurm`; submission through :mod:`hpcppo.launch.submit`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from hpcppo.errors import HpcppoError, RunStateError
from hpcppo.fsutil import atomic_write_text
from hpcppo.launch import render as _render
from hpcppo.launch.rundir import (
    RESOLVED,
    SCRIPT,
    SPEC,
    RunDir,
    create_run_dir,
    list_runs,
    new_run_id,
)

# ----------------------------------------------------------------------------- compile / submit


@attrs.frozen
class CompiledRun:
    run: RunDir
    script: str
    compiled: Any


def runs_root_for(site: Any, override: str | None = None) -> Path:
    root = override or os.environ.get("HPCPPO_RUNS_ROOT") or site.paths.runs_root
    return Path(os.path.expandvars(os.path.expanduser(root))).resolve()


def compile_run(
    exp_path: Path | None,
    site_name: str,
    overrides: Sequence[str] = (),
    *,
    runs_root: str | None = None,
    kind: str = "train",
    nodes: int | None = None,
    check_paths: bool = True,
) -> CompiledRun:
    """Load, validate and resolve; write ``spec.toml``, ``resolved.toml`` and ``job.sbatch`` atomically.

    Every error is raised before the run directory appears: the directory is filled in a hidden
    temporary directory and renamed into place only when everything succeeded.
    """
    from hpcppo import config

    if kind == "preflight":
        compiled = config.compile_preflight(site_name, nodes=nodes, overrides=overrides)
        spec_text = compiled.spec_text
    else:
        assert exp_path is not None
        compiled = config.compile_config(exp_path, site_name, overrides, check_paths=check_paths)
        spec_text = Path(exp_path).read_text()
    root = runs_root_for(compiled.site, runs_root)
    run_id = new_run_id(compiled.experiment.name)
    final = root / run_id
    python = compiled.site.env.python or sys.executable
    # Local runs always use this interpreter: the venv that runs hpcppo is the one the job needs.
    if compiled.site.scheduler == "local":
        python = sys.executable
    script = _render.render(compiled.site, compiled.experiment, compiled.plan, final, python=python)
    with create_run_dir(root, run_id) as tmp:
        atomic_write_text(tmp / SPEC, spec_text)
        atomic_write_text(tmp / RESOLVED, config.to_toml(compiled))
        atomic_write_text(tmp / SCRIPT, script, mode=0o755)
    return CompiledRun(run=RunDir(final), script=script, compiled=compiled)


def submit_run(crun: CompiledRun) -> str:
    """Submit a compiled run; returns the scheduler's job id (recorded in ``run.json``).

    When the submission fails (``sbatch`` missing or rejecting the job), the run directory that
    :func:`compile_run` just made is removed: it holds only copies of the user's inputs, and a run
    that never reached the scheduler must not show up in ``hpcppo status``.
    """
    from hpcppo.launch import submit

    plan = crun.compiled.plan
    try:
        if crun.compiled.site.scheduler == "slurm":
            return submit.submit_slurm(crun.run, plan.nodes, plan.ranks_per_node)
        return submit.submit_local(crun.run, plan.world_size, plan.time_limit_s / 60)
    except HpcppoError as exc:
        if not getattr(exc, "keep_run_dir", False):
            discard_unsubmitted(crun.run)
        raise


def resume_run(run: RunDir) -> str:
    """Submit an existing run again — the same ``job.sbatch`` — as a new attempt; the job continues from
    its newest committed checkpoint. A pause marker is cleared first. Returns the new job id."""
    from hpcppo import config
    from hpcppo.errors import RunStateError
    from hpcppo.launch import submit

    st = run_status(run)
    if st["state"] not in FINAL_STATES | {"NOT_SUBMITTED", "UNKNOWN"}:
        raise RunStateError(f"run {run.run_id} is {st['state']} (job {st['job_id']}); it can be resumed once it has "
                            f"stopped", hint=f"hpcppo cancel {run.run_id}")
    for marker in ("PAUSE", "PAUSED"):
        (run.control / marker).unlink(missing_ok=True)
    compiled = config.load_resolved(run.resolved)
    plan = compiled.plan
    if compiled.site.scheduler == "slurm":
        return submit.submit_slurm(run, plan.nodes, plan.ranks_per_node)
    return submit.submit_local(run, plan.world_size, plan.time_limit_s / 60)


def discard_unsubmitted(run: RunDir) -> bool:
    """Remove a run directory that has no recorded attempt (never submitted); True when removed."""
    if run.read_record().get("attempts"):
        return False
    # Hide it from list_runs first (a dot name), then delete: a crash midway leaves no visible run.
    hidden = run.path.with_name(f".{run.run_id}.discarded-{os.getpid()}")
    try:
        os.rename(run.path, hidden)
    except OSError:
        return False
    shutil.rmtree(hidden, ignore_errors=True)
    return True


def wait_for(run: RunDir, *, poll_s: float = 2.0, timeout_s: float | None = None, echo=None,
             unknown_grace_s: float = 300.0) -> dict[str, Any]:
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


# ----------------------------------------------------------------------------- status / cancel
FINAL_STATES = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE",
    "PREEMPTED", "PAUSED",
}


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


def _latest_checkpoint(run: RunDir) -> int | None:
    steps = []
    if run.checkpoints.is_dir():
        for p in run.checkpoints.iterdir():
            if p.name.startswith("step-") and (p / "COMMITTED").exists():
                try:
                    steps.append(int(p.name.split("-", 1)[1]))
                except ValueError:
                    pass
    return max(steps) if steps else None


def statuses(runs: Sequence[RunDir]) -> list[dict[str, Any]]:
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
                query_error: str | None) -> dict[str, Any]:  # fmt: skip
    attempts = record.get("attempts", [])
    status: dict[str, Any] = {
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
        "latest_checkpoint": _latest_checkpoint(run),
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
        from hpcppo.launch import submit

        local = submit.local_job_info(run, status["job_id"], int(meta["world_size"]))
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


def _remember_final_state(run: RunDir, record: dict[str, Any], status: dict[str, Any]) -> None:
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


def run_status(run: RunDir) -> dict[str, Any]:
    return statuses([run])[0]


def all_statuses(runs_root: Path) -> list[dict[str, Any]]:
    return statuses(list_runs(runs_root))


def cancel_run(run: RunDir) -> dict[str, Any]:
    """Cancel the run's current job unless it already ended.

    Returns ``{"job_id", "state", "cancelled"}``: the state before the request, and whether a cancel
    was sent. ``RunStateError`` when the run was never submitted.
    """
    st = run_status(run)
    if st["state"] == "NOT_SUBMITTED":
        raise RunStateError(f"run {run.run_id} was never submitted; nothing to cancel")
    job_id = str(st["job_id"])
    if st["state"] in FINAL_STATES:
        return {"job_id": job_id, "state": st["state"], "cancelled": False}
    if st["scheduler"] == "slurm":
        from hpcppo.launch import slurm

        slurm.cancel(job_id)
        cancelled = True
    else:
        from hpcppo.launch import submit

        cancelled = submit.cancel_local(run, job_id)
    if cancelled:
        run.update_attempt(job_id, cancel_requested_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    return {"job_id": job_id, "state": st["state"], "cancelled": cancelled}
