"""Submission through submitit: the Slurm executor submits our rendered script verbatim; the local
executor runs the rendered local script once per rank.

On Slurm, :class:`ScriptSlurmExecutor` overrides submitit's ``_make_submission_file_text`` hook (a
private hook, hence the pinned submitit minor version and a test against the real dev cluster that
compares ``scontrol write batch_script`` with ``job.sbatch``). Our script runs the job entry point
under ``srun`` itself, so submitit submits it and runs no pickled callable.

On ``--site local``, :func:`run_local_rank` is the callable submitit's local executor runs in each of
its processes: it exports the torch.distributed variables submitit knows and executes ``job.sbatch``
(the rendered local script), so both sites run the same entry point with the run directory as its
only argument. What a submitted job is doing is read by :mod:`hpcppo.launch.status`. No torch import here.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import io
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hpcppo.errors import HpcppoError, SchedulerError
from hpcppo.launch import slurm  # the only module that knows where sbatch lives
from hpcppo.launch.runrecords import local_controller_alive
from hpcppo.launch.status import LOCAL_SIGNAL_DELAY_S
from hpcppo.rundir import RunDir, exitcodes
from hpcppo.rundir.paths import RunPaths, local_attempt


def _noop() -> None:  # pragma: no cover - pickled by submitit, never run (our script runs the job)
    return None


# submitit has no public way to submit a script of one's own: its public parameters (``setup``, ``teardown``,
# ``additional_parameters``, ``srun_args``) only add to the text that ``submitit/slurm/slurm.py:
# _make_sbatch_string`` writes, which always ends in ``srun ... -m submitit.core._submit``. The text of the file
# that ``sbatch`` gets comes from one method, ``SlurmExecutor._make_submission_file_text(self, command, uid)``
# (``submitit/slurm/slurm.py``), called by ``PicklingExecutor._submit_command`` (``submitit/core/core.py``); it has that
# name and signature in every release from 1.0 to 1.5.4. pyproject.toml pins ``submitit>=1.5.4,<1.6`` and
# ``tests/unit/test_submitit_pin.py`` checks the installed version and the hook.
SUBMITIT_HOOK = "_make_submission_file_text"


def _slurm_executor_class() -> type:
    import submitit

    class ScriptSlurmExecutor(submitit.SlurmExecutor):
        """A SlurmExecutor whose submission file is our rendered script, byte for byte (see ``SUBMITIT_HOOK``)."""

        def __init__(self, folder: Path, script_text: str):
            super().__init__(folder=folder)
            self._script_text = script_text

        def _make_submission_file_text(self, command: str, uid: str) -> str:  # noqa: ARG002
            return self._script_text

    return ScriptSlurmExecutor


def submit_slurm(run: RunDir, nodes: int, ranks_per_node: int) -> str:
    """Submit ``run.script`` with sbatch through submitit; returns the job id."""
    slurm.sbatch_path()  # clear SchedulerError when sbatch is not on PATH
    import submitit

    text = run.script.read_text()
    executor = _slurm_executor_class()(folder=run.submitit, script_text=text)
    # Only used by submitit to count tasks for its job object; the directives live in the script.
    executor.update_parameters(nodes=nodes, ntasks_per_node=ranks_per_node)
    submitted_at = _dt.datetime.now(_dt.timezone.utc)
    # submitit echoes a failing sbatch's stderr on ours; the error below carries it as one line instead.
    echoed = io.StringIO()
    try:
        with contextlib.redirect_stderr(echoed):
            job = executor.submit(_noop)
    except submitit.core.utils.FailedJobError as exc:
        raise SchedulerError(f"sbatch rejected the job: {_stderr_of(exc)}") from None
    except submitit.core.utils.FailedSubmissionError as exc:
        # sbatch succeeded but printed no job id we recognise: a job may be queued, and it needs its
        # run directory, so this error keeps it (jobs.submit_run removes it for the other errors).
        m = re.search(r'output "(.*?)"', str(exc), re.S)
        answer = m.group(1) if m else str(exc)
        err = SchedulerError(f"sbatch answered without a job id ({answer.strip()!r}); the job may be queued "
                             f"anyway (check squeue); run directory kept: {run.path}")
        err.keep_run_dir = True  # type: ignore[attr-defined]
        raise err from None
    except OSError as exc:  # sbatch vanished between the PATH check and the call, or is not executable
        raise SchedulerError(f"could not run sbatch: {exc}") from None
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

    executor = submitit.LocalExecutor(folder=run.submitit)
    # submitit's controller sends USR2 signal_delay_s before the time limit (the ranks checkpoint and exit 75, which
    # status reports as TIMEOUT) and kills the ranks at the limit.
    executor.update_parameters(
        tasks_per_node=ranks, nodes=1, timeout_min=timeout_min, gpus_per_node=0, signal_delay_s=LOCAL_SIGNAL_DELAY_S
    )
    submitted_at = _dt.datetime.now(_dt.timezone.utc)

    def start() -> str:
        # `hpcppo cancel` stops the job by a SIGINT to the controller, which hands one to each rank wrapper. A
        # command started in the background by a non-interactive shell (`hpcppo submit ... &`, a script, nohup)
        # runs with SIGINT ignored, and an ignored signal stays ignored across exec: controller and wrappers would
        # ignore the cancel. This forked child only starts the controller, so it can reset that for its children.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        # The controller and the ranks start in the run directory, not in the caller's working directory: that one
        # may be deleted after the submit (a temporary directory, a cleaned-up checkout), and a process whose
        # working directory is gone fails to start Python or load torch (issue 25).
        os.chdir(run.path)
        # submitit starts the controller with our stdout/stderr: it outlives this command, and would write
        # to the user's terminal later (a traceback on cancel). Give it the run's controller log instead.
        with _fds_to(run.local_controller_log):
            return str(executor.submit(run_local_rank, str(run.path)).job_id)

    job_id = _in_new_session(start)
    run.add_attempt(
        job_id=job_id,
        scheduler="local",
        state="RUNNING",
        submitted_at=submitted_at.isoformat(timespec="seconds"),
        kind="submit",
    )
    return job_id


def _in_new_session(fn: Callable[[], str]) -> str:
    """``fn()`` run in a forked child that starts a session of its own; its result (or its error) comes back.

    submitit's local executor starts the job's controller as a child of the submitting process, in its process
    group (``subprocess.Popen`` without ``start_new_session``, submitit 1.5 ``local.start_controller``): a Ctrl-C
    typed in the terminal reaches every process of the foreground group, the controller too, and a closed terminal
    sends it SIGHUP; either would end the job. Started from a new session, the controller is out of the terminal's
    reach, like a batch job; ``hpcppo cancel`` still stops it (it signals the controller's pid, the job id).
    """
    import pickle
    import traceback

    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_fd)
        try:
            os.setsid()
            result: tuple[Any, ...] = ("ok", fn())
        except HpcppoError as exc:
            result = ("error", str(exc), exc.exit_code)
        except BaseException:  # noqa: BLE001 - a bug: its traceback goes to the parent
            result = ("bug", traceback.format_exc())
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(pickle.dumps(result))
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    if not data:
        raise SchedulerError("starting the local job failed: the submitting process died without an answer")
    result = pickle.loads(data)  # our own child's bytes
    if result[0] == "ok":
        job_id: str = result[1]
        return job_id
    if result[0] == "error":
        err = SchedulerError(result[1])
        err.exit_code = result[2]
        raise err
    raise SchedulerError(f"starting the local job failed:\n{result[1]}")


@contextlib.contextmanager
def _fds_to(path: Path) -> Iterator[None]:
    """Point file descriptors 1 and 2 at ``path`` (appending) while child processes are started."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def run_local_rank(run_dir: str) -> int:
    """Body of one local rank: export torch.distributed variables, run the rendered local script."""
    import submitit

    env_info = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    job_env = submitit.JobEnvironment()
    env = dict(os.environ)
    paths = RunPaths(run_dir)
    env["HPCPPO_ATTEMPT"] = local_attempt(str(job_env.job_id))
    rank_log = paths.rank_log(env["HPCPPO_ATTEMPT"], env_info.rank)
    rank_log.parent.mkdir(parents=True, exist_ok=True)
    with open(rank_log, "ab") as log:
        # Its own process group, so a cancel stops the whole rank (setup commands included), not
        # just the shell; the parent-death signal covers submitit killing this wrapper outright.
        proc = subprocess.Popen(["bash", str(paths.script)], env=env, stdout=log, cwd=paths.path,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
        _forward_to_group(proc)
        try:
            returncode = proc.wait()
        except BaseException:  # KeyboardInterrupt: submitit's controller forwards a cancel as SIGINT
            _stop_group(proc)
            raise
    if returncode not in (exitcodes.DONE, exitcodes.PAUSED, exitcodes.REQUEUE):
        how = f"was ended by {signal.Signals(-returncode).name}" if returncode < 0 else f"exited with {returncode}"
        raise RuntimeError(f"rank {env_info.rank} {how}; see {rank_log}")
    return returncode


def _forward_to_group(proc: subprocess.Popen[bytes]) -> None:
    """Hand USR2 (submitit's "time limit is near", like Slurm's ``--signal``) and TERM to the rank's
    process group, where the trainer checkpoints on them, instead of submitit's own handlers: those
    end this wrapper without a checkpoint (rank 0) or ignore the signal (other ranks)."""
    def forward(signum: int, frame: Any) -> None:  # noqa: ARG001
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signum)

    for sig in (signal.SIGUSR2, signal.SIGTERM):
        signal.signal(sig, forward)


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """Linux: SIGTERM this process when its parent (the rank wrapper) dies, even by SIGKILL."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG


def _stop_group(proc: subprocess.Popen[bytes], grace_s: float = 0.5) -> None:
    """SIGTERM the rank's process group, then SIGKILL what is left after ``grace_s`` (submitit's
    controller SIGKILLs this wrapper about a second after its SIGINT)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace_s)
            if sig == signal.SIGTERM:
                # the leader is gone; its children may linger in the group
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue


def cancel_local(run: RunDir, job_id: str) -> bool:
    """Interrupt a local job's controller (it stops the ranks); False when it was not running."""
    if not local_controller_alive(job_id, run.submitit):
        return False
    os.kill(int(job_id), signal.SIGINT)
    return True
