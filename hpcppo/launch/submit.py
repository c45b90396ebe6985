"""Submission through submitit: the Slurm executor submits our rendered script verbatim; the local
executor runs the rendered local script once per rank.

On Slurm, :class:`ScriptSlurmExecutor` overrides submitit's ``_make_submission_file_text`` hook (a
private hook, hence the pinned submitit minor version and a test against the real dev cluster that
compares ``scontrol write batch_script`` with ``job.sbatch``). Our script runs the job entry point
under ``srun`` itself, so submitit is used for submission and state, not to run a pickled callable.

On ``--site local``, :func:`run_local_rank` is the callable submitit's local executor runs in each of
its processes: it exports the torch.distributed variables submitit knows and executes ``job.sbatch``
(the rendered local script), so both sites run the same entry point with the run directory as its
only argument. No torch import here.
"""

from __future__ import annotations

import datetime as _dt
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hpcppo import exitcodes
from hpcppo.errors import SchedulerError
from hpcppo.launch.rundir import RunDir

SUBMITIT_DIR = "submitit"


def _noop() -> None:  # pragma: no cover - pickled by submitit, never run (our script runs the job)
    return None


def _slurm_executor_class() -> type:
    import submitit

    class ScriptSlurmExecutor(submitit.SlurmExecutor):
        """A SlurmExecutor whose submission file is our rendered script, byte for byte."""

        def __init__(self, folder: Path, script_text: str):
            super().__init__(folder=folder)
            self._script_text = script_text

        def _make_submission_file_text(self, command: str, uid: str) -> str:  # noqa: ARG002
            return self._script_text

    return ScriptSlurmExecutor


def submit_slurm(run: RunDir, nodes: int, ranks_per_node: int) -> str:
    """Submit ``run.script`` with sbatch through submitit; returns the job id."""
    from hpcppo.launch import slurm  # the only module that knows where sbatch lives

    slurm.sbatch_path()  # clear SchedulerError when sbatch is not on PATH
    import submitit

    text = run.script.read_text()
    executor = _slurm_executor_class()(folder=run.path / SUBMITIT_DIR, script_text=text)
    # Only used by submitit to count tasks for its job object; the directives live in the script.
    executor.update_parameters(nodes=nodes, ntasks_per_node=ranks_per_node)
    submitted_at = _dt.datetime.now(_dt.timezone.utc)
    try:
        job = executor.submit(_noop)
    except submitit.core.utils.FailedJobError as exc:
        raise SchedulerError(f"sbatch rejected the job: {_stderr_of(exc)}") from None
    except submitit.core.utils.FailedSubmissionError as exc:
        raise SchedulerError(f"could not read sbatch's answer: {exc}") from None
    run.add_attempt(
        job_id=str(job.job_id),
        scheduler="slurm",
        state="PENDING",
        submitted_at=submitted_at.isoformat(timespec="seconds"),
        kind="submit",
    )
    return str(job.job_id)


def _stderr_of(exc: Exception) -> str:
    text = str(exc)
    # submitit's CommandFunction error embeds "Error stream produced:\n<stderr>"
    marker = "Error stream produced:"
    if marker in text:
        text = text.split(marker, 1)[1]
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip()) or str(exc)


def submit_local(run: RunDir, ranks: int, timeout_min: float) -> str:
    """Start the run with submitit's local executor (one process per rank); returns its job id."""
    import submitit

    executor = submitit.LocalExecutor(folder=run.path / SUBMITIT_DIR)
    executor.update_parameters(
        tasks_per_node=ranks, nodes=1, timeout_min=timeout_min, gpus_per_node=0, signal_delay_s=30
    )
    submitted_at = _dt.datetime.now(_dt.timezone.utc)
    job = executor.submit(run_local_rank, str(run.path))
    run.add_attempt(
        job_id=str(job.job_id),
        scheduler="local",
        state="RUNNING",
        submitted_at=submitted_at.isoformat(timespec="seconds"),
        kind="submit",
    )
    return str(job.job_id)


def run_local_rank(run_dir: str) -> int:
    """Body of one local rank: export torch.distributed variables, run the rendered local script."""
    import submitit

    env_info = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    job_env = submitit.JobEnvironment()
    env = dict(os.environ)
    env["HPCPPO_ATTEMPT"] = f"local-{job_env.job_id}"
    log_dir = Path(run_dir) / "logs" / f"attempt-local-{job_env.job_id}"
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"rank-{env_info.rank}.log", "ab") as log:
        proc = subprocess.run(["bash", str(Path(run_dir) / "job.sbatch")], env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode not in (exitcodes.DONE, exitcodes.PAUSED, exitcodes.REQUEUE):
        raise RuntimeError(
            f"rank {env_info.rank} exited with {proc.returncode}; see {log_dir / f'rank-{env_info.rank}.log'}"
        )
    return proc.returncode


def _local_controller_alive(job_id: str) -> bool:
    """The local executor's job id is its controller's pid: alive and still submitit's controller."""
    try:
        cmdline = Path(f"/proc/{int(job_id)}/cmdline").read_bytes()
        status = Path(f"/proc/{int(job_id)}/status").read_text()
    except (OSError, ValueError):
        return False
    zombie = any(line.startswith("State:") and "Z" in line.split()[1] for line in status.splitlines())
    return not zombie and b"submitit" in cmdline


def local_job_state(run: RunDir, job_id: str, ntasks: int) -> str:
    """State of a local-executor job from its controller process and submitit's result files."""
    import pickle

    from submitit.core.utils import JobPaths

    if _local_controller_alive(job_id):
        return "RUNNING"
    outcomes = []
    for task in range(ntasks):
        path = JobPaths(run.path / SUBMITIT_DIR, job_id=job_id, task_id=task).result_pickle
        if not path.exists():
            outcomes.append("missing")
            continue
        with path.open("rb") as f:  # written by submitit in our own run directory
            outcomes.append(pickle.load(f)[0])
    if all(o == "success" for o in outcomes):
        return "COMPLETED"
    if any(o == "error" for o in outcomes):
        return "FAILED"
    return "CANCELLED"


def cancel_local(job_id: str) -> bool:
    """Interrupt a local job's controller (it forwards the signal to the ranks)."""
    import signal

    if not _local_controller_alive(job_id):
        return False
    os.kill(int(job_id), signal.SIGINT)
    return True


def python_for_jobs() -> str:
    """The interpreter a local job uses: the one running hpcppo (the venv's)."""
    return sys.executable
