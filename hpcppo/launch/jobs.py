"""What the CLI does, as a library: compile, submit, preflight, status, cancel.

Everything here runs on a login node: no torch import (a test checks ``sys.modules``). Scheduler
commands go through :mod:`hpcppo.launch.slurm`; submission through :mod:`hpcppo.launch.submit`.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from hpcppo.errors import RunIdError
from hpcppo.launch import render as _render
from hpcppo.launch.rundir import (
    RESOLVED,
    SCRIPT,
    SPEC,
    RunDir,
    atomic_write_text,
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
    """Submit a compiled run; returns the scheduler's job id (recorded in ``run.json``)."""
    from hpcppo.launch import submit

    plan = crun.compiled.plan
    if crun.compiled.site.scheduler == "slurm":
        return submit.submit_slurm(crun.run, plan.nodes, plan.ranks_per_node)
    return submit.submit_local(crun.run, plan.world_size, plan.time_limit_s / 60)


def wait_for(run: RunDir, *, poll_s: float = 2.0, timeout_s: float | None = None, echo=None) -> dict[str, Any]:
    """Poll :func:`run_status` until the last attempt reaches a final state."""
    start = time.monotonic()
    while True:
        st = run_status(run)
        if echo:
            echo(st)
        if st["state"] in FINAL_STATES:
            return st
        if timeout_s is not None and time.monotonic() - start > timeout_s:
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
    """Status of several runs with one batched scheduler query for all Slurm jobs."""
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
            infos = slurm.query_jobs(list(slurm_jobs), submitted_after=slurm_jobs)
        except SchedulerError as exc:
            query_error = str(exc)
    out = []
    for r in runs:
        out.append(_one_status(r, metas[r.run_id], records[r.run_id], infos, query_error))
    return out


def _one_status(run: RunDir, meta: dict[str, Any], record: dict[str, Any], infos: dict[str, Any], query_error: str | None) -> dict[str, Any]:
    attempts = record.get("attempts", [])
    status: dict[str, Any] = {
        "run_id": run.run_id,
        "path": str(run.path),
        "site": meta["site"],
        "scheduler": meta["scheduler"],
        "attempts": len(attempts),
        "job_id": None,
        "state": "NOT_SUBMITTED",
        "reason": None,
        "elapsed_s": None,
        "restarts": None,
        "latest_checkpoint": _latest_checkpoint(run),
        "paused": (run.control / "PAUSED").exists(),
    }
    if not attempts:
        return status
    last = attempts[-1]
    status["job_id"] = str(last["job_id"])
    submitted = _parse_time(last.get("submitted_at"))
    if meta["scheduler"] == "slurm":
        info = infos.get(status["job_id"])
        if info is None:
            status["state"] = "UNKNOWN"
            status["reason"] = query_error or "not known to the scheduler (purged from its memory and no accounting?)"
        else:
            status["state"] = info.state
            status["reason"] = info.reason
            status["elapsed_s"] = info.elapsed_s
            status["restarts"] = info.restart_count
            status["source"] = info.source
    else:
        from hpcppo.launch import submit

        status["state"] = submit.local_job_state(run, status["job_id"], int(meta["world_size"]))
        if submitted:
            status["elapsed_s"] = (_dt.datetime.now(_dt.timezone.utc) - submitted).total_seconds() if status["state"] == "RUNNING" else None
    if status["paused"] and status["state"] in FINAL_STATES | {"UNKNOWN"}:
        status["state"] = "PAUSED"
    return status


def run_status(run: RunDir) -> dict[str, Any]:
    return statuses([run])[0]


def all_statuses(runs_root: Path) -> list[dict[str, Any]]:
    return statuses(list_runs(runs_root))


def cancel_run(run: RunDir) -> str:
    """Cancel the run's current job; returns its job id."""
    record = run.read_record()
    if not record.get("attempts"):
        raise RunIdError(f"run {run.run_id} was never submitted; nothing to cancel")
    last = record["attempts"][-1]
    job_id = str(last["job_id"])
    if _run_meta(run)["scheduler"] == "slurm":
        from hpcppo.launch import slurm

        slurm.cancel(job_id)
    else:
        from hpcppo.launch import submit

        submit.cancel_local(job_id)
    run.update_last_attempt(cancel_requested_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    return job_id
