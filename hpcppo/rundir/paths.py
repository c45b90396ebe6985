"""Every name in a run directory, spelled once: the processes of a run (ranks, batch script, monitor, CLI) meet here.

:class:`RunPaths` turns a run directory into the path of each of its files; the module-level names are the
file and directory names themselves, for the few readers that match names (a listing, a glob). The batch
script gets the same names through :meth:`RunPaths.shell`, which the renderer passes to the templates.
Nothing here touches the file system except the listing helpers (``attempt_files``, ``exit_records_of``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# --------------------------------------------------------------------------- top level
SPEC = "spec.toml"  # the experiment as given
RESOLVED = "resolved.toml"  # everything after defaults and overrides: the job's only input
SCRIPT = "job.sbatch"  # exactly what was submitted
RUN_JSON = "run.json"  # the attempts, their job ids and states
RUN_JSON_LOCK = ".run.json.lock"  # flock of run.json's read-modify-write
LOCK = ".lock"  # one writer per run (hpcppo.rundir.lock)
EVENTS = "events.jsonl"  # the audit log (hpcppo.rundir.events)
PREFLIGHT = "preflight.json"  # the report of a preflight job
METRICS, CHECKPOINTS, CONTROL, LOGS = "metrics", "checkpoints", "control", "logs"
SUBMITIT = "submitit"  # submitit's folder (submission files, logs and result pickles of its jobs)
TENSORBOARD = "tensorboard"  # TensorBoard event files (trainer.logger "tensorboard"; hpcppo.metrics.trackers)
SAMPLES = "samples"  # samples/step-<N>.jsonl: a few trajectories of each step (trainer.log_samples; hpcppo samples)
SAMPLE_FILE_RE = re.compile(r"^step-(\d+)\.jsonl$")
WANDB = "wandb"  # wandb's offline runs (trainer.logger "wandb"): wandb names this folder itself, under the run dir
SUBDIRS = (METRICS, CHECKPOINTS, CONTROL, LOGS)

# --------------------------------------------------------------------------- control/
PAUSE = "PAUSE"  # a request to pause at the next step boundary
PAUSED = "PAUSED"  # why the run stopped on request (its text)
EXIT_RECORD = "exit-code."  # + attempt key: rank 0's (or the monitor's) exit code of one job attempt
REQUESTS, DONE, REJECTED = "requests", "done", "rejected"  # the inbox (hpcppo.rundir.control)

# --------------------------------------------------------------------------- metrics/
ATTEMPT_FILE_RE = re.compile(r"^attempt-(\d+)\.h5$")
"""``attempt-NNNN.h5``: one HDF5 metric file per attempt of the trainer."""

# --------------------------------------------------------------------------- logs/
LOG_DIR_PREFIX = "attempt-"  # logs/attempt-<job>.<restart>/, logs/attempt-local-<job>/
LOCAL_ATTEMPT_PREFIX = "local-"
RANK_LOG_RE = re.compile(r"^rank-(\d+)\.log$")
WATCHDOG_LOG = "watchdog.log"
MONITOR_HEARTBEAT = "watchdog.heartbeat"  # the monitor's heartbeat (hpcppo.rundir.heartbeat)
VERSIONS = "versions.json"  # the library versions an attempt runs with (hpcppo.train.versions)
LOCAL_CONTROLLER_LOG = "local-controller.log"


def attempt_filename(attempt: int) -> str:
    """``attempt-0001.h5`` for attempt 1: zero-padded so a plain sort is the attempt order."""
    return f"attempt-{attempt:04d}.h5"


def tensorboard_suffix(attempt: int) -> str:
    """The end of the name of the TensorBoard event file an attempt writes in ``tensorboard/``."""
    return f".attempt-{attempt}"


def rank_log_name(rank: int | str) -> str:
    """``rank-<r>.log``; ``rank`` may be a placeholder such as srun's ``%t``."""
    return f"rank-{rank}.log"


def batch_log_name(job_id: str) -> str:
    """``slurm-<job>.out``; ``job_id`` may be sbatch's ``%j``."""
    return f"slurm-{job_id}.out"


def local_attempt(job_id: str) -> str:
    """The attempt key of a local job's logs: ``local-<job>``."""
    return f"{LOCAL_ATTEMPT_PREFIX}{job_id}"


def exit_record_name(attempt_key: str) -> str:
    return f"{EXIT_RECORD}{attempt_key}"


class _Under:
    """A path under the run directory: ``RunPaths(d).<attribute>`` is ``d/<parts...>``."""

    def __init__(self, *parts: str):
        self.parts = parts

    def __get__(self, obj: RunPaths, owner: type | None = None) -> Path:
        return obj.path.joinpath(*self.parts)

    def __set__(self, obj: RunPaths, value: object) -> None:
        raise AttributeError("a run directory's paths are fixed by its path")


class RunPaths:
    """The paths of one run directory. Building a path never creates or checks it (only the listings,
    :meth:`attempt_files` and :meth:`exit_records_of`, read a folder)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    @property
    def run_id(self) -> str:
        return self.path.name

    # top level
    spec = _Under(SPEC)
    resolved = _Under(RESOLVED)
    script = _Under(SCRIPT)
    run_json = _Under(RUN_JSON)
    run_json_lock = _Under(RUN_JSON_LOCK)
    lock_file = _Under(LOCK)
    events = _Under(EVENTS)
    preflight = _Under(PREFLIGHT)
    metrics = _Under(METRICS)
    checkpoints = _Under(CHECKPOINTS)
    control = _Under(CONTROL)
    logs = _Under(LOGS)
    submitit = _Under(SUBMITIT)
    tensorboard = _Under(TENSORBOARD)
    wandb = _Under(WANDB)
    samples = _Under(SAMPLES)

    # control/
    pause_request = _Under(CONTROL, PAUSE)
    paused = _Under(CONTROL, PAUSED)
    requests = _Under(CONTROL, REQUESTS)
    done = _Under(CONTROL, DONE)
    rejected = _Under(CONTROL, REJECTED)

    def exit_record(self, attempt_key: str) -> Path:
        """``control/exit-code.<attempt key>`` (``<job>.<restart>`` on Slurm, ``local.<n>`` locally)."""
        return self.control / exit_record_name(attempt_key)

    def exit_records_of(self, job_id: str) -> dict[int, Path]:
        """The exit records of every restart of Slurm job ``job_id``: ``{restart: path}``."""
        pattern = re.compile(rf"{re.escape(exit_record_name(job_id))}\.(\d+)")
        try:
            names = [p.name for p in self.control.iterdir()]
        except OSError:
            return {}
        return {int(m.group(1)): self.control / n for n in names if (m := pattern.fullmatch(n))}

    def exit_records(self) -> dict[str, Path]:
        """Every exit record of the run: ``{attempt key: path}`` (empty when ``control/`` cannot be listed)."""
        try:
            names = [p.name for p in self.control.iterdir()]
        except OSError:
            return {}
        return {n[len(EXIT_RECORD):]: self.control / n for n in sorted(names) if n.startswith(EXIT_RECORD)}

    # metrics/
    def attempt_file(self, attempt: int) -> Path:
        return self.metrics / attempt_filename(attempt)

    def attempt_files(self) -> dict[int, Path]:
        """The metric files present, ``{attempt: path}`` in attempt order."""
        return attempt_files_in(self.metrics)

    # samples/
    def sample_file(self, step: int) -> Path:
        """``samples/step-<N>.jsonl``: the sample trajectories of step N (a redone step replaces it)."""
        return self.samples / f"step-{step}.jsonl"

    def sample_files(self) -> dict[int, Path]:
        """Step -> its sample file, for the steps that have one."""
        if not self.samples.is_dir():
            return {}
        found = ((SAMPLE_FILE_RE.match(p.name), p) for p in self.samples.iterdir())
        return dict(sorted((int(m.group(1)), p) for m, p in found if m and p.is_file()))

    # logs/
    def log_dir(self, attempt_key: str) -> Path:
        """``logs/attempt-<attempt key>/``: the rank logs and the watchdog's log of one job attempt."""
        return self.logs / f"{LOG_DIR_PREFIX}{attempt_key}"

    def rank_log(self, attempt_key: str, rank: int | str) -> Path:
        return self.log_dir(attempt_key) / rank_log_name(rank)

    def watchdog_log(self, attempt_key: str) -> Path:
        """``logs/attempt-<attempt key>/watchdog.log``: the output of the monitor beside the trainer."""
        return self.log_dir(attempt_key) / WATCHDOG_LOG

    def monitor_heartbeat(self, attempt_key: str) -> Path:
        """``logs/attempt-<attempt key>/watchdog.heartbeat``: the monitor's last sign of life (hpcppo.rundir.heartbeat)."""
        return self.log_dir(attempt_key) / MONITOR_HEARTBEAT

    def versions(self, attempt_key: str) -> Path:
        """``logs/attempt-<attempt key>/versions.json``: Python, torch, CUDA, transformers and vLLM of the job."""
        return self.log_dir(attempt_key) / VERSIONS

    def batch_log(self, job_id: str) -> Path:
        return self.logs / batch_log_name(job_id)

    @property
    def local_controller_log(self) -> Path:
        return self.logs / LOCAL_CONTROLLER_LOG

    @classmethod
    def shell(cls, attempt_var: str = "$HPCPPO_ATTEMPT") -> dict[str, str]:
        """The run-relative paths the batch script uses, with the attempt key left to the shell variable
        ``attempt_var``: the templates join them to ``$HPCPPO_RUN_DIR``."""
        rel = cls(".")
        return {"resolved": RESOLVED, "exit_record": str(rel.exit_record(attempt_var)),
                "log_dir": str(rel.log_dir(attempt_var)), "watchdog_log": WATCHDOG_LOG,
                "rank_log": rank_log_name("%t")}


def attempt_files_in(folder: str | os.PathLike[str]) -> dict[int, Path]:
    """The ``attempt-NNNN.h5`` entries of ``folder``, ``{attempt: path}`` in attempt order (empty when the folder
    cannot be listed)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return {}
    found = {int(m.group(1)): Path(e.path) for e in entries if (m := ATTEMPT_FILE_RE.match(e.name))}
    return dict(sorted(found.items()))


def is_metrics_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is named as a run's ``metrics/`` folder (for readers given a path, not a run)."""
    return Path(path).name == METRICS


def in_metrics_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` lies directly in a folder named as a run's ``metrics/``: its run is ``path.parent.parent``."""
    return Path(path).parent.name == METRICS
