"""What the CLI does, as a library: compile, submit, preflight, resume, cancel, rollback.

Everything here runs on a login node: no torch import (a test checks ``sys.modules``). Scheduler
commands go through :mod:`hpcppo.launch.slurm`; submission through :mod:`hpcppo.launch.submit`; what a
run's job is doing comes from :mod:`hpcppo.launch.status`. Every function that changes a run holds the
run's writer lock (:meth:`RunDir.lock`) from the status it decides on to the attempt it records, so two
commands never both start a job in one run directory: the second is told the run is busy, or what state
the first left it in.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import shutil
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from hpcppo import config
from hpcppo.compiler import compile_config, compile_preflight
from hpcppo.errors import ConfigError, HpcppoError, RunIdError, RunStateError, SettingWarning
from hpcppo.fsutil import atomic_write_text
from hpcppo.launch import render as _render
from hpcppo.launch import slurm, submit
from hpcppo.launch.shell import RUN_DIR_VARIABLE, script_run_dir
from hpcppo.launch.status import JobStatus, run_status
from hpcppo.rundir import RunDir, RunIdTakenError, RunPaths, control, create_run_dir, events, new_run_id
from hpcppo.rundir import checkpoints as layout

RUN_ID_TRIES = 8
"""Fresh run ids drawn before giving up when each one is taken (4 hex digits per second: a collision is rare)."""

# ----------------------------------------------------------------------------- compile / submit


@attrs.frozen
class CompiledRun:
    run: RunDir
    script: str
    compiled: Any


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
    if kind == "preflight":
        compiled = compile_preflight(site_name, nodes=nodes, overrides=overrides, runs_root_override=runs_root)
    else:
        assert exp_path is not None
        compiled = compile_config(exp_path, site_name, overrides, check_paths=check_paths)
    root = config.runs_root(compiled.site, runs_root)
    origin = config.runs_root_origin(compiled.site, runs_root)
    _warn_overruled_runs_root(overrides, origin, root)
    python = _job_python(compiled)
    resolved = config.to_toml(compiled)
    for _ in range(RUN_ID_TRIES):
        # The script names its run directory: a taken id (another run made in the same second) means a new id
        # and a new script.
        final = root / new_run_id(compiled.experiment.name)
        script = _render.render(compiled.site, compiled.experiment, compiled.plan, final, python=python)
        try:
            with create_run_dir(root, final.name, origin=origin) as tmp:
                filling = RunPaths(tmp)
                atomic_write_text(filling.spec, compiled.spec_text)
                atomic_write_text(filling.resolved, resolved)
                atomic_write_text(filling.script, script, mode=0o755)
        except RunIdTakenError:
            continue
        return CompiledRun(run=RunDir(final), script=script, compiled=compiled)
    raise RunIdError(f"could not find a free run id under {root} in {RUN_ID_TRIES} tries (the last: {final.name})",
                     hint="are the runs root's entries created by something else?")


def _warn_overruled_runs_root(overrides: Sequence[str], origin: str, root: Path) -> None:
    """``-o site.paths.runs_root=DIR`` loses to ``--runs-root`` and ``$HPCPPO_RUNS_ROOT`` (the documented precedence,
    :func:`hpcppo.config.runs_root`): one line says which root is used and why, instead of silence."""
    if origin.startswith("site.") or not any(o.partition("=")[0].strip() == "site.paths.runs_root" for o in overrides):
        return
    warnings.warn(f"-o site.paths.runs_root has no effect: {origin} is set and comes first; the run goes under {root}",
                  SettingWarning, stacklevel=2)


def _job_python(compiled: Any) -> str:
    """The interpreter the job runs: the site's ``env.python``, else this one; local runs always use this one (the
    venv that runs hpcppo is the one the job needs)."""
    if compiled.site.scheduler == "local":
        return sys.executable
    return compiled.site.env.python or sys.executable


def script_for_here(run: RunDir, compiled: Any) -> str | None:
    """Make ``job.sbatch`` run in the directory the run is in now; returns the directory it named before when it
    had to be rendered again (a run directory copied or moved elsewhere), None when it already ran here.

    A copied run's script still names the original directory: resubmitted unchanged, its job trained into the
    original while the copy's ``run.json`` recorded the attempt (issue 25). It is rendered again from
    ``resolved.toml`` for this directory (atomically; a ``control.moved`` event records it). A script that names
    no directory (a site's own template without the ``HPCPPO_RUN_DIR=`` line) cannot be checked: refused.
    """
    try:
        named = script_run_dir(run.script.read_text(errors="replace"))
    except OSError as exc:
        raise RunStateError(f"{run.script} cannot be read: {exc.strerror or exc}") from None
    if named is None:
        raise RunStateError(f"{run.script} does not say which run directory it runs in (no plain "
                            f"{RUN_DIR_VARIABLE}= line): cannot tell whether it would write into {run.path}",
                            hint="compile the spec again into a new run")
    if os.path.realpath(named) == os.path.realpath(run.path):
        return None
    script = _render.render(compiled.site, compiled.experiment, compiled.plan, run.path, python=_job_python(compiled))
    atomic_write_text(run.script, script, mode=0o755)
    with contextlib.suppress(OSError):  # the script is right now; the record of it is for people
        events.append_event(run.path, kind=events.RUN_MOVED, step=None, source="control",
                            message=f"job.sbatch named {named}; rendered again for {run.path}", previous_dir=named)
    return named


def submit_run(crun: CompiledRun) -> str:
    """Submit a compiled run; returns the scheduler's job id (recorded in ``run.json``).

    When the submission fails (``sbatch`` missing or rejecting the job), the run directory that
    :func:`compile_run` just made is removed: it holds only copies of the user's inputs, and a run
    that never reached the scheduler must not show up in ``hpcppo status``.
    """
    with crun.run.lock("submit"):
        if crun.run.read_record().get("attempts"):
            raise RunStateError(f"run {crun.run.run_id} was submitted already", hint=f"hpcppo resume {crun.run.run_id}")
        try:
            return _submit(crun.run, crun.compiled)
        except HpcppoError as exc:
            if not getattr(exc, "keep_run_dir", False):
                discard_unsubmitted(crun.run)
            raise


def resume_run(run: RunDir) -> str:
    """Submit an existing run again — the same ``job.sbatch`` — as a new attempt; the job continues from
    its newest committed checkpoint. A pause marker is cleared first. Returns the new job id.

    ``RunStateError`` while its job runs, and for a run whose steps are all done (exit record 0, or the newest
    committed checkpoint is the last step) unless a rollback request is queued (:func:`rollback_run` writes one
    and then resumes): there is nothing else to resume. ``RunBusyError`` while another command changes the run.
    """
    with run.lock("resume"):
        return _resume_locked(run, _status_to_decide_on(run))


def _resume_locked(run: RunDir, st: JobStatus) -> str:
    """:func:`resume_run` with the writer lock held and the run's status ``st`` decided under it."""
    if not st.stopped():
        raise RunStateError(f"run {run.run_id} is {st.state} (job {st.job_id}); it can be resumed once it "
                            f"has stopped", hint=f"hpcppo cancel {run.run_id}")
    if ((st.state == "COMPLETED" or st.steps_done)
            and not any(r.action == "rollback" for r in control.pending(run.path))):  # fmt: skip
        ckpt = st.latest_checkpoint
        raise RunStateError(f"run {run.run_id} has done all its {st.total_steps} steps "
                            f"({st.state}, checkpoint {'-' if ckpt is None else ckpt}); there is nothing to "
                            f"resume", hint=f"train again from an earlier checkpoint with hpcppo rollback "
                                            f"{run.run_id} --to STEP, or submit a new run with more "
                                            f"trainer.total_steps")
    control.clear_pause(run)
    return _submit(run, config.load_resolved(run.resolved))


def _submit(run: RunDir, compiled: Any) -> str:
    """Submit the run's ``job.sbatch`` to its site's scheduler as a new attempt (rendered again first when it names
    another directory: :func:`script_for_here`); returns the job id."""
    script_for_here(run, compiled)
    plan = compiled.plan
    if compiled.site.scheduler == "slurm":
        return submit.submit_slurm(run, plan.nodes, plan.ranks_per_node)
    return submit.submit_local(run, plan.world_size, plan.time_limit_s / 60)


def _status_to_decide_on(run: RunDir) -> JobStatus:
    """The run's status, the one answer a command that changes the run decides on (``st.stopped()``: may a new
    attempt start); ``RunStateError`` when its ``run.json`` cannot be read (nothing can be decided)."""
    st = run_status(run)
    if st.state == "UNREADABLE":
        raise RunStateError(str(st.reason))
    return st


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


# ----------------------------------------------------------------------------- cancel
def cancel_run(run: RunDir) -> dict[str, Any]:
    """Cancel the run's current job unless it already ended.

    Returns ``{"job_id", "state", "cancelled"}``: the state before the request, and whether a cancel
    was sent. ``RunStateError`` when the run was never submitted.
    """
    with run.lock("cancel"):
        return _cancel_locked(run, _status_to_decide_on(run))


def _cancel_locked(run: RunDir, st: JobStatus) -> dict[str, Any]:
    if st.state == "NOT_SUBMITTED":
        raise RunStateError(f"run {run.run_id} was never submitted; nothing to cancel")
    job_id = str(st.job_id)
    if st.final:
        return {"job_id": job_id, "state": st.state, "cancelled": False}
    if st.scheduler == "slurm":
        slurm.cancel(job_id)
        cancelled = True
    else:
        cancelled = submit.cancel_local(run, job_id)
    if cancelled:
        run.update_attempt(job_id, cancel_requested_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    return {"job_id": job_id, "state": st.state, "cancelled": cancelled}


# ----------------------------------------------------------------------------- rollback
@attrs.frozen
class Rollback:
    """What :func:`rollback_run` did: the request written and how it will reach a trainer."""

    request: Any  # hpcppo.rundir.control.Request
    checkpoint: int  # the committed checkpoint it goes back to, as the run directory stands now
    state: str  # the run's state when asked
    job_id: str | None  # the running job that will read the request, or the new attempt's job
    resubmitted: bool  # True: the run had stopped and was submitted again


def rollback_run(run: RunDir, *, to_step: int | None = None, lr_scale: float | None = None) -> Rollback:
    """Roll ``run`` back to its newest committed checkpoint at or before ``to_step`` (None: the newest),
    with the learning rates multiplied by ``lr_scale`` (None: the trainer's default, 0.5).

    Everything is checked before anything is written: the parameters (``RequestError``) and a committed
    checkpoint at or before ``to_step`` (``RunStateError`` listing the committed ones). Then a request goes
    into ``control/requests/``. A job that is running (or pending) applies it at its next step boundary
    (before its first step). A stopped run — any final state, COMPLETED included — is submitted again as a
    new attempt whose trainer applies the request before its first step; when that submission fails the
    request is withdrawn. A job that ends between the status query and the request leaves the request
    queued: the next ``hpcppo resume`` applies it.
    """
    control.validate_params("rollback", to_step=to_step, lr_scale=lr_scale)
    with run.lock("rollback"):
        return _rollback_locked(run, to_step=to_step, lr_scale=lr_scale)


def _check_rollback_target(run: RunDir, st: JobStatus, to_step: int | None, checkpoint: int) -> None:
    """``--to`` counts the run's steps: past ``trainer.total_steps`` it means nothing; and a stopped run that would
    restart at its last step has zero steps left to train (a resubmission for nothing)."""
    total = st.total_steps
    if not isinstance(total, int):
        return
    if to_step is not None and to_step > total:
        raise ConfigError(f"--to {to_step}: run {run.run_id} has {total} steps; allowed: 0 to {total}")
    if st.stopped() and checkpoint >= total:
        raise RunStateError(f"run {run.run_id}: checkpoint step {checkpoint} is its last step ({total}); going back "
                            f"to it leaves nothing to train", hint=f"hpcppo rollback {run.run_id} --to STEP below "
                                                                   f"{checkpoint}")


def _rollback_locked(run: RunDir, *, to_step: int | None, lr_scale: float | None) -> Rollback:
    committed = layout.list_committed(run.checkpoints)
    eligible = [s for s in committed if to_step is None or s <= to_step]
    if not eligible:
        where = "" if to_step is None else f" at or before step {to_step}"
        listed = ", ".join(map(str, committed[-20:])) if committed else "none"
        raise RunStateError(f"run {run.run_id} has no committed checkpoint{where}; committed checkpoints: "
                            f"{'..., ' if len(committed) > 20 else ''}{listed}")
    st = _status_to_decide_on(run)
    _check_rollback_target(run, st, to_step, eligible[-1])
    request = control.submit_request(run.path, "rollback", to_step=to_step, lr_scale=lr_scale)
    if not st.stopped():
        return Rollback(request=request, checkpoint=eligible[-1], state=st.state, job_id=st.job_id,
                        resubmitted=False)
    try:
        # The request queued above also lets a run whose steps are all done be resubmitted: it takes it back first.
        # The status decided on above answers "stopped" for the resubmission too (the lock is held since).
        job_id = _resume_locked(run, st)
    except BaseException:
        control.withdraw(run.path, request)
        raise
    return Rollback(request=request, checkpoint=eligible[-1], state=st.state, job_id=str(job_id), resubmitted=True)
