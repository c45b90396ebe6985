"""The process beside the trainer: ``python -m hpcppo.watchdog RUN_DIR [--attempt ID] [--interval S]``.

The trainer judges its own metric rows (:mod:`hpcppo.watchdog.decide`); this process sees what it cannot see
itself, from outside: a **hang** (no new metrics row for too long) and a **dead trainer** (its processes are
gone and rank 0 left no exit record ``control/exit-code.<attempt>``). No torch import.

Where it runs. The batch script starts it in the background on the batch host, before ``srun``: in the container
on apptainer sites, outside it on pyxis sites (``site.container.monitor_python``, a host-side Python with hpcppo:
from a pyxis container neither ``scancel`` nor the ``srun`` process is in reach, :meth:`Monitor.stop_slurm_steps`).
At every look it rewrites its heartbeat (:mod:`hpcppo.rundir.heartbeat`), which ``hpcppo status`` reads. On ``--site
local`` the rendered local script of rank 0 starts it (once per job, not per rank) in a session of its own, so
that stopping the ranks does not stop it. It exits by itself when the attempt ends, after it acted, or when the batch
script's EXIT trap sends SIGTERM — then it takes a last look first. The attempt has ended when its exit record
appears, its trainers are gone (or none appeared within ``NEVER_SEEN_S``: it failed at start), a newer attempt is
recorded in ``run.json`` or writes the newest metric file (each file names the job attempt that writes it), the
run is done (another attempt recorded exit code 0, or the last step's checkpoint is committed), or, locally, the
job's submitit controller is gone. These are checked again right before it acts: a monitor never acts on another
attempt and never restarts a run that is done (:meth:`Monitor.attempt_over`).

Hang. The threshold is ``max(min_heartbeat_s, heartbeat_factor x median step time)``, the step times being the
differences between consecutive rows' ``time`` in this attempt's file. Until two rows give a step time it is
the **startup allowance**, ``STARTUP_FACTOR x min_heartbeat_s`` (30 min with the defaults): loading a large
model, starting vLLM and the first rollout take minutes, and a false hang during startup would requeue a
healthy job forever. Silence is measured on this process's monotonic clock from the moment a row was written
(its ``time``, clamped to the last poll) or, before any row, from the start of the monitor.
On a hang it appends a ``hang`` event, then:

* Slurm: it writes exit code 75 (:data:`hpcppo.rundir.exitcodes.REQUEUE`) as this attempt's exit record and cancels the
  job's srun steps (``scancel JOB.STEP``). ``srun`` returns, and the batch script does what it does for a
  preemption: it reads the record and calls ``scontrol requeue``; the requeued job resumes from the newest
  committed checkpoint and starts its own monitor. One recovery path for preemption and hangs, and the
  batch script stays the only place that requeues. (Slurm puts a ~2 min BeginTime on a requeued job.)
* local: it cancels the submitit job (its controller stops the ranks; leftovers of this attempt get SIGKILL)
  and starts a new attempt exactly as ``hpcppo resume`` does (:func:`hpcppo.launch.jobs.resume_run`); rank 0 of
  the new attempt starts a new monitor, and this one exits.

After ``MAX_RESTARTS`` hang recoveries recorded in ``events.jsonl`` it stops the job instead (exit record 1 on
Slurm), so a run that hangs deterministically does not loop forever. With ``site.slurm.requeue = false`` it
stops the job too.

Trainer liveness. The trainer processes of this attempt are the processes on this host whose command line
runs ``hpcppo.train.main`` on this run directory and whose environment has this ``HPCPPO_ATTEMPT`` (on Slurm,
``srun`` and the ranks of the batch host; locally, every rank). The PIDs are found once by a scan of
``/proc`` and then only rechecked. Dead = seen alive, now none for ``DEAD_GRACE_S`` and still no exit record
and no cancel requested -> a ``trainer_dead`` event. On Slurm the batch script's trap delivers the last look
right after ``srun`` returned. A whole-job ``scancel`` reaches both at once; the trainers are then still
alive (they checkpoint on SIGTERM) and nothing is recorded.

Reading the SWMR log. Each poll opens the newest ``metrics/attempt-NNNN.h5`` of this attempt (a newer file
replaces the one followed: an attempt change), reads only the new rows of ``seq``/``step``/``time`` and stops at
the first row not yet whole (``seq[i] != i`` or a missing time). A file that does not exist yet, cannot be
opened or read (half-created, killed writer, truncated) is "no new row" for that poll. The file is opened by
:func:`hpcppo.metrics.h5io.open_swmr`, whose bounded HDF5 metadata retries keep a truncated file from blocking
the reader (why it blocked: :mod:`hpcppo.metrics.h5io`); the next poll tries again anyway.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import math
import os
import signal
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from hpcppo.rundir import RunDir, events, exitcodes, heartbeat
from hpcppo.rundir.checkpoints import latest_committed
from hpcppo.rundir.events import append_event, read_events
from hpcppo.rundir.paths import RunPaths

log = logging.getLogger("hpcppo.watchdog.monitor")

ENTRY_MODULE = "hpcppo.train.main"  # the job entry point (hpcppo.launch.render.ENTRY_MODULE)
STARTUP_FACTOR = 3.0  # startup allowance = STARTUP_FACTOR x min_heartbeat_s, until two rows give a step time
DEAD_GRACE_S = 5.0  # trainers gone for this long without an exit record -> trainer_dead
NEVER_SEEN_S = 120.0  # no trainer process of the attempt this long after the start: it failed at start -> exit
MAX_RESTARTS = 3  # hang recoveries per run; then the job is stopped instead
STOP_WAIT_S = 30.0  # local: how long to wait for the cancelled controller before SIGKILLing leftovers
# What a local rank inherits from submitit and must not pass on to the controller of a new attempt.
_JOB_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "HPCPPO_ATTEMPT")


# ----------------------------------------------------------------------------- the hang arithmetic (pure)
def startup_allowance_s(min_heartbeat_s: float) -> float:
    return STARTUP_FACTOR * min_heartbeat_s


def heartbeat_threshold_s(step_times: Sequence[float], *, heartbeat_factor: float, min_heartbeat_s: float) -> float:
    """Seconds without a new row after which the trainer counts as hung."""
    if not step_times:
        return startup_allowance_s(min_heartbeat_s)
    return max(min_heartbeat_s, heartbeat_factor * statistics.median(step_times))


def step_durations(times: Sequence[float], previous: float | None = None) -> list[float]:
    """Differences of consecutive row times (``previous`` = the time of the row before ``times``); only
    positive finite ones (a clock step back or a garbage time must not shrink the median)."""
    out, last = [], previous
    for t in times:
        if last is not None and math.isfinite(t - last) and t - last > 0:
            out.append(t - last)
        last = t
    return out


# ----------------------------------------------------------------------------- following the SWMR log
@attrs.frozen
class LogState:
    """What the follower knows after a poll."""

    file_index: int | None  # NNNN of the file followed (= the attempt), None before it exists
    rows: int  # whole rows seen in it
    last_step: int | None
    last_row_time: float | None  # the writer's unix time of the newest row
    step_times: tuple[float, ...]
    new_rows: int  # rows this poll found
    switched: bool  # this poll moved to a newer file
    error: str | None  # why this poll could not read (None: it could)
    owner: str | None = None  # the job attempt that writes the file (its ``job_attempt`` attribute; None: not said)


class LogFollower:
    """Follows the newest ``attempt-NNNN.h5`` with ``NNNN >= first_index`` in ``<run>/metrics``."""

    def __init__(self, run_dir: Path, *, first_index: int = 0, locking: bool | None = None, keep: int = 10_000):
        self.paths = RunPaths(run_dir)
        self.first_index = first_index
        self.locking = locking
        self.keep = keep
        self.state = LogState(None, 0, None, None, (), 0, False, None)

    def poll(self) -> LogState:
        files = {i: p for i, p in self.paths.attempt_files().items() if i >= self.first_index}
        st = self.state
        if not files:
            self.state = attrs.evolve(st, new_rows=0, switched=False, error="no metric file yet")
            return self.state
        index = max(files)
        switched = index != st.file_index
        if switched:  # an attempt change: this file's rows say nothing about the last one's
            st = LogState(index, 0, None, None, (), 0, True, None)
        try:
            owner, steps, times = self._read_new(files[index], st.rows)
        except (OSError, KeyError, ValueError, RuntimeError) as exc:  # h5py maps HDF5 errors onto these
            self.state = attrs.evolve(st, new_rows=0, switched=switched, error=f"{type(exc).__name__}: {exc}")
            return self.state
        durations = st.step_times + tuple(step_durations(times, st.last_row_time))
        self.state = LogState(
            file_index=index, rows=st.rows + len(steps), last_step=steps[-1] if steps else st.last_step,
            last_row_time=times[-1] if times else st.last_row_time, step_times=durations[-self.keep:],
            new_rows=len(steps), switched=switched, error=None, owner=owner)
        return self.state

    def _read_new(self, path: Path, start: int) -> tuple[str | None, list[int], list[float]]:
        from hpcppo.metrics import h5io  # h5py (and pandas) on the first poll, not at import

        with h5io.open_swmr(path, self.locking) as f:
            raw = f.attrs.get("job_attempt")  # files written before the attribute existed say nothing
            owner = (raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)) if raw is not None else None
            seq_ds, step_ds, time_ds = f["seq"], f["step"], f["time"]
            n = min(seq_ds.shape[0], step_ds.shape[0], time_ds.shape[0])
            if n <= start:
                return owner or None, [], []
            seqs, steps, times = seq_ds[start:n].tolist(), step_ds[start:n].tolist(), time_ds[start:n].tolist()
        whole = 0  # rows are appended in order: stop at the first one not complete yet (seq is written last)
        for i, (q, s, t) in enumerate(zip(seqs, steps, times)):
            if q != start + i or s < 0 or not (math.isfinite(t) and t > 0):
                break
            whole += 1
        return owner or None, [int(s) for s in steps[:whole]], [float(t) for t in times[:whole]]


# ----------------------------------------------------------------------------- the trainer's processes
def _proc_args(pid: int, name: str) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return None


def _proc_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time: tells a reused PID apart); None when gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields[19] if len(fields) > 19 else None


class TrainerProcesses:
    """The trainer processes of one attempt on this host (see the module docstring)."""

    def __init__(self, run_dir: Path, job_attempt: str):
        self.run_dir = os.path.realpath(run_dir)
        self.env_entry = f"HPCPPO_ATTEMPT={job_attempt}".encode()
        self.known: dict[int, str] = {}
        self.seen = False

    def _matches(self, pid: int) -> bool:
        args = _proc_args(pid, "cmdline")
        if not args or ENTRY_MODULE.encode() not in args:
            return False
        if not any(a and os.path.realpath(os.fsdecode(a)) == self.run_dir for a in args):
            return False
        env = _proc_args(pid, "environ")
        return env is not None and self.env_entry in env

    def scan(self) -> dict[int, str]:
        found = {}
        with contextlib.suppress(OSError):
            for entry in os.scandir("/proc"):
                if entry.name.isdigit() and int(entry.name) != os.getpid() and self._matches(int(entry.name)):
                    started = _start_time(int(entry.name))
                    if started is not None:
                        found[int(entry.name)] = started
        return found

    def alive(self) -> bool | None:
        """True: some are running; False: seen before, none now; None: never seen (not started yet)."""
        self.known = {p: s for p, s in self.known.items() if _start_time(p) == s}
        if not self.known:
            self.known = self.scan()
        if self.known:
            self.seen = True
            return True
        return False if self.seen else None

    def kill(self) -> list[int]:
        killed = []
        for pid in (self.known | self.scan()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        return killed


# ----------------------------------------------------------------------------- the monitor
@attrs.frozen(kw_only=True)
class Settings:
    interval_s: float
    heartbeat_factor: float
    min_heartbeat_s: float
    scheduler: str  # "slurm" or "local"
    requeue: bool = True  # site.slurm.requeue
    locking: bool | None = None
    max_restarts: int = MAX_RESTARTS
    follow_log: bool = True  # False when the site writes without SWMR: no hang detection, liveness only
    total_steps: int | None = None  # the run's last step (a training run); None: not known


class _Wake(Exception):
    pass


class Monitor:
    def __init__(self, run_dir: Path, job_attempt: str, settings: Settings, *, first_index: int | None = None):
        self.run_dir = Path(run_dir)
        self.job_attempt = job_attempt
        self.s = settings
        if first_index is None:  # the trainer of this attempt will write metrics/attempt-<files so far>.h5
            first_index = len(RunPaths(self.run_dir).attempt_files())
        self.attempt = first_index  # the trainer's attempt, numbered as its metrics file, used in the events
        self.follower = LogFollower(self.run_dir, first_index=first_index, locking=settings.locking)
        self.trainers = TrainerProcesses(self.run_dir, job_attempt)
        self.parent = os.getppid()
        self.record = RunPaths(self.run_dir).exit_record(job_attempt)  # rank 0's verdict (or ours)
        self._stop: int | None = None
        self._sleeping = False
        self._beat_failed = False

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        # Slurm's --signal=USR2@lead (a checkpoint before the time limit) is for the trainers; by default it would
        # end this process.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        started = time.monotonic()
        last_progress, last_poll, dead_since = started, started, None
        log.info("following %s (attempt %d, job attempt %s); interval %gs, heartbeat x%g, at least %gs",
                 self.run_dir, self.attempt, self.job_attempt, self.s.interval_s, self.s.heartbeat_factor,
                 self.s.min_heartbeat_s)
        while True:
            if self._stop is not None:
                return self.last_look(f"signal {signal.Signals(self._stop).name}")
            self.beat()
            if self.s.scheduler == "slurm" and os.getppid() != self.parent:
                return self.last_look("the batch script is gone")
            st = self.follower.poll()
            now = time.monotonic()
            if st.switched:
                log.info("following metrics/attempt-%04d.h5", st.file_index)
                last_progress = now
            if st.new_rows:
                age = max(0.0, time.time() - st.last_row_time) if st.last_row_time else 0.0
                last_progress = now - min(age, now - last_poll)  # never earlier than the previous poll
            last_poll = now
            code = self.exit_record()
            if code is not None:
                log.info("exit record %s of attempt %s: the job is ending; bye", code, self.job_attempt)
                return 0
            over = self.attempt_over(st)
            if over is not None:
                return self.on_over(over)
            alive = self.trainers.alive()
            if alive is None and now - started >= NEVER_SEEN_S:
                return self.on_never_seen(now - started)
            if alive is False:
                dead_since = dead_since if dead_since is not None else now
                if now - dead_since >= DEAD_GRACE_S:
                    return self.on_dead(now - dead_since)
            else:
                dead_since = None
            threshold = heartbeat_threshold_s(st.step_times, heartbeat_factor=self.s.heartbeat_factor,
                                              min_heartbeat_s=self.s.min_heartbeat_s)
            silence = now - last_progress
            if self.s.follow_log and silence >= threshold:
                return self.on_hang(st, silence, threshold)
            pause = min(self.s.interval_s, max(0.2, threshold - silence)) if self.s.follow_log else self.s.interval_s
            if dead_since is not None:
                pause = min(pause, max(0.2, DEAD_GRACE_S - (now - dead_since)))
            self._sleep(pause)

    def beat(self) -> None:
        """The heartbeat ``hpcppo status`` reads (:mod:`hpcppo.rundir.heartbeat`): rewritten at every look, so a
        monitor that died or hangs itself goes stale. A failed write is logged once; the monitor goes on."""
        try:
            heartbeat.write(self.run_dir, self.job_attempt, interval_s=self.s.interval_s)
        except OSError as exc:
            if not self._beat_failed:
                log.error("could not write the heartbeat %s: %s", RunPaths(self.run_dir).monitor_heartbeat(
                    self.job_attempt), exc)
            self._beat_failed = True

    def _on_signal(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        self._stop = signum
        if self._sleeping:
            raise _Wake()

    def _sleep(self, seconds: float) -> None:
        self._sleeping = True
        try:
            if self._stop is None:
                time.sleep(seconds)
        except _Wake:
            pass
        finally:
            self._sleeping = False

    # -- what it sees -------------------------------------------------------------------------------------
    def attempt_over(self, st: LogState | None = None) -> str | None:
        """Why this monitor's attempt is over although its own exit record does not say so (None: it may still
        run). A monitor acts on its own attempt only: these are checked before every action, and end it.

        * the newest metric file is another job attempt's (its ``job_attempt`` attribute): a newer attempt writes;
        * ``run.json`` records a newer attempt after this one;
        * another attempt recorded exit code 0, or the newest committed checkpoint is the last step: the run is done;
        * local: the job's submitit controller is gone (it outlives every rank of its job).
        """
        if st is not None and st.owner and st.owner != self.job_attempt:
            name = RunPaths(self.run_dir).attempt_file(st.file_index or 0).name
            return f"the newest metric file {name} is written by attempt {st.owner}: a newer attempt started"
        newer = self.newer_attempt()
        if newer is not None:
            return f"a newer attempt (job {newer}) was submitted"
        done = self.run_done()
        if done is not None:
            return done
        if self.s.scheduler == "local" and not self.local_controller_alive():
            return f"the controller of local job {self.local_job_id()} is gone"
        return None

    def newer_attempt(self) -> str | None:
        """The job id of an attempt recorded in ``run.json`` after this one (None: none, or not known)."""
        try:
            attempts = RunDir(self.run_dir).read_record().get("attempts", [])
        except (OSError, ValueError):
            return None
        ids = [str(a.get("job_id")) for a in attempts if isinstance(a, dict)]
        mine = self.local_job_id() if self.s.scheduler == "local" else self.job_attempt.split(".", 1)[0]
        if mine not in ids:
            return None  # not recorded yet (the submitter records it once the job started)
        later = ids[len(ids) - 1 - ids[::-1].index(mine) + 1:]
        return later[-1] if later else None

    def run_done(self) -> str | None:
        """Why the run's steps are all done (None: they are not, or it is not known)."""
        for key in RunPaths(self.run_dir).exit_records():
            if key != self.job_attempt and exitcodes.read_exit_record(self.run_dir, key) == exitcodes.DONE:
                return f"attempt {key} recorded exit code {exitcodes.DONE}: the run is done"
        latest = latest_committed(RunPaths(self.run_dir).checkpoints) if self.s.total_steps is not None else None
        if latest is not None and self.s.total_steps is not None and latest >= self.s.total_steps:
            return f"checkpoint {latest} is the last step: the run is done"
        return None

    def local_controller_alive(self) -> bool:
        from hpcppo.launch.runrecords import local_controller_alive

        return local_controller_alive(self.local_job_id(), RunPaths(self.run_dir).submitit)

    def exit_record(self) -> str | None:
        try:
            return self.record.read_text().strip() or "?"
        except OSError:
            return None

    def cancel_requested(self) -> bool:
        """A user's ``hpcppo cancel`` of this job (local: recorded in run.json)."""
        job_id = self.local_job_id()
        with contextlib.suppress(OSError, ValueError):
            for attempt in RunDir(self.run_dir).read_record().get("attempts", []):
                if str(attempt.get("job_id")) == job_id and attempt.get("cancel_requested_at"):
                    return True
        return False

    def local_job_id(self) -> str:
        return self.job_attempt.removeprefix("local-")

    def event(self, kind: str, step: int | None, message: str, **details: Any) -> None:
        log.warning("%s: %s", kind, message)
        try:
            append_event(self.run_dir, kind=kind, step=step, source="monitor", message=message,
                         attempt=self.attempt, job_attempt=self.job_attempt, **details)
        except OSError as exc:  # the log line above keeps the story
            log.error("could not append to events.jsonl: %s", exc)

    # -- what it does -----------------------------------------------------------------------------------
    def on_over(self, why: str) -> int:
        """The attempt is over (:meth:`attempt_over`): nothing to watch, nothing to do; a trainer of this attempt
        that vanished without an exit record is still recorded, as at the end of a job."""
        if self.trainers.seen and not self.trainers.alive() and self.exit_record() is None:
            self.trainer_dead(f"the trainer processes of attempt {self.job_attempt} ended without an exit record "
                              f"({why})")
        log.info("attempt %s is over: %s; bye", self.job_attempt, why)
        return 0

    def on_never_seen(self, waited_s: float) -> int:
        """No trainer process of this attempt ever appeared: it failed at start (or runs on another host)."""
        if self.exit_record() is None and self.attempt_over() is None:
            self.trainer_dead(f"no trainer process of attempt {self.job_attempt} appeared on this host in "
                              f"{waited_s:.0f} s and no exit record", waited_s=round(waited_s, 3))
        log.info("no trainer of attempt %s seen in %.0f s; bye", self.job_attempt, waited_s)
        return 0

    def last_look(self, why: str) -> int:
        """The job is ending: a trainer that is gone without an exit record died."""
        code = self.exit_record()
        if code is not None:
            log.info("exit record %s of attempt %s: the job is ending; stopping (%s)", code, self.job_attempt, why)
            return 0
        if self.trainers.seen and not self.trainers.alive():
            self.trainer_dead(f"the trainer processes ended without an exit record ({why})")
        log.info("stopping (%s)", why)
        return 0

    def on_dead(self, gone_s: float) -> int:
        self.trainer_dead(f"no trainer process of attempt {self.job_attempt} for {gone_s:.0f} s and no exit record",
                          gone_s=gone_s)
        return 0

    def trainer_dead(self, what: str, **details: Any) -> None:
        """A ``trainer_dead`` event, unless the job was cancelled (local: recorded in run.json)."""
        if self.s.scheduler == "local" and self.cancel_requested():
            log.info("the job was cancelled; bye")
            return
        st = self.follower.poll()  # the rows written since the last poll
        self.event(events.TRAINER_DEAD, st.last_step, f"{what}; last step {st.last_step}", rows=st.rows, **details)

    def on_hang(self, st: LogState, silence: float, threshold: float) -> int:
        over = self.attempt_over(st)  # never act on another attempt, nor on a run that is done
        if over is not None:
            return self.on_over(over)
        hangs = read_events(self.run_dir, kinds=[events.HANG])
        restarts = sum(1 for e in hangs if e.get("action") in ("requeue", "restart"))
        recover = restarts < self.s.max_restarts and (self.s.scheduler == "local" or self.s.requeue)
        action = ("requeue" if self.s.scheduler == "slurm" else "restart") if recover else "cancel"
        median = statistics.median(st.step_times) if st.step_times else None
        why = "" if recover else (f" ({restarts} hang recoveries already)" if restarts >= self.s.max_restarts
                                  else " (the job may not be requeued)")
        self.event(events.HANG, st.last_step, f"no new metrics row for {silence:.0f} s (threshold {threshold:.0f} s) "
                   f"after step {st.last_step}; {action}{why}", seconds_since_row=round(silence, 3),
                   threshold_s=round(threshold, 3), median_step_s=median, rows=st.rows, action=action,
                   restarts_before=restarts)
        try:
            if self.s.scheduler == "slurm":
                self.stop_slurm_steps(exitcodes.REQUEUE if recover else exitcodes.FAILED)
            else:
                self.restart_local(recover)
        except Exception as exc:  # noqa: BLE001 - recorded; a monitor that dies silently helps nobody
            self.event(events.MONITOR_ERROR, st.last_step, f"{action} after a hang failed: {type(exc).__name__}: {exc}")
            return 1
        return 0

    def stop_slurm_steps(self, code: int) -> None:
        """Exit record for the batch script, then cancel the job's srun steps (it requeues on 75)."""
        from hpcppo.errors import SchedulerError
        from hpcppo.launch import slurm

        if not self.record.exists():  # a verdict of rank 0 written meanwhile wins
            exitcodes.write_exit_record(self.run_dir, self.job_attempt, code)
        job_id = os.environ.get("SLURM_JOB_ID") or self.job_attempt.split(".", 1)[0]
        try:
            steps = slurm.job_steps(job_id)
            for step in steps:
                slurm.cancel_step(step)
        except SchedulerError as exc:
            # No Slurm commands here (the monitor runs in the job's container): srun ends its step when it
            # receives two SIGINTs within a second.
            sruns = [p for p in self.trainers.known | self.trainers.scan() if _proc_name(p) == "srun"]
            if not sruns:
                raise
            log.warning("%s; interrupting srun %s twice instead", exc, sruns)
            for _ in range(2):
                for pid in sruns:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGINT)
                time.sleep(0.2)
            steps = [f"srun pid {p}" for p in sruns]
        log.info("exit record %d written; cancelled %s", code, ", ".join(steps) or "no step (none running)")

    def restart_local(self, recover: bool) -> None:
        """Stop this attempt's ranks; start a new attempt as ``hpcppo resume`` does."""
        from hpcppo.launch import jobs, runrecords, submit

        run, job_id = RunDir(self.run_dir), self.local_job_id()
        folder = RunPaths(self.run_dir).submitit
        if submit.cancel_local(run, job_id):
            now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
            with contextlib.suppress(OSError):
                run.update_attempt(job_id, cancel_requested_at=now, cancelled_by="watchdog monitor: hang")
        deadline = time.monotonic() + STOP_WAIT_S
        while runrecords.local_controller_alive(job_id, folder) and time.monotonic() < deadline:
            time.sleep(0.2)
        killed = self.trainers.kill()
        if killed:
            log.warning("SIGKILLed leftover trainer processes %s", killed)
        if not recover:
            return
        done = self.run_done()  # the ranks may have finished the run while they were being stopped
        if done is not None:
            log.info("not restarting: %s", done)
            return
        for name in list(os.environ):  # the new controller must not inherit this rank's job variables
            if name in _JOB_ENV or name.startswith("SUBMITIT_"):
                del os.environ[name]
        new_job = jobs.resume_run(run)
        self.event(events.MONITOR_RESTARTED, self.follower.state.last_step,
                   f"attempt {self.job_attempt} stopped after a hang; new attempt started as local job {new_job}",
                   new_job_id=str(new_job))


def settings_from_run(run_dir: Path, *, interval_s: float | None = None) -> tuple[Settings, bool]:
    """(settings, watchdog.enable) from ``RUN_DIR/resolved.toml``."""
    from hpcppo.config import load_resolved

    compiled = load_resolved(RunPaths(run_dir).resolved)
    wd, site = compiled.experiment.watchdog, compiled.site
    # 0: total_epochs x steps per epoch, known to the trainer only
    total = compiled.plan.total_steps if compiled.job.kind == "train" and compiled.plan.total_steps > 0 else None
    settings = Settings(interval_s=interval_s or wd.interval_s, heartbeat_factor=wd.heartbeat_factor,
                        min_heartbeat_s=wd.min_heartbeat_s, scheduler=site.scheduler, total_steps=total,
                        requeue=bool(getattr(site.slurm, "requeue", True)),
                        locking=None if site.hdf5.locking else False, follow_log=bool(site.hdf5.swmr))
    if not site.hdf5.swmr:
        log.warning("site.hdf5.swmr is false: the metric log cannot be read while it is written, so hangs are not "
                    "detected; the monitor only watches whether the trainer is alive")
    return settings, bool(wd.enable)
