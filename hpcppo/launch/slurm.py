"""The one module that runs Slurm's commands: ``sbatch``, ``squeue``, ``sacct``, ``scontrol``, ``scancel``.

Two layers:

* pure parsers of the commands' text output (``parse_sacct``, ``parse_squeue``,
  ``parse_scontrol_show_job``, ``parse_sbatch``), unit-tested on literal strings;
* thin wrappers that run a command as an argument list (never through a shell), with a timeout so a
  hung ``slurmctld`` cannot hang the CLI, and turn every failure into a ``SchedulerError`` that
  carries the command's stderr.

``query_jobs`` is what callers poll: one batched ``sacct`` call (the accounting database keeps jobs
after ``slurmctld`` forgot them), then one ``squeue`` call for the jobs that are still live or that
accounting does not know yet (it lags the controller, e.g. right after a requeue). When accounting is
disabled or ``slurmdbd`` is down, the ``squeue`` path alone answers.

Job ids can be reused (a controller that lost its state starts counting again): a record whose
submit time is earlier than the submit time the caller recorded for that attempt belongs to another
job and is never reported. Note that Slurm resets a job's submit time when it is requeued, so the
records of one job's later runs always pass that test.

No torch here: the login-node CLI imports this module.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence

import attrs

from hpcppo.errors import SchedulerError

COMMAND_TIMEOUT_S = 30.0
# The submit time a caller records is taken on its own clock just before sbatch; Slurm stores whole
# seconds on the controller's clock. This much earlier is still the same job.
CLOCK_SLACK_S = 5.0

FINISHED_STATES = frozenset(
    {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
     "PREEMPTED", "REVOKED", "TIMEOUT"}
)  # fmt: skip
"""States after which the job (this record of it) will not run again."""

SACCT_FIELDS = ("JobID", "State", "Reason", "Submit", "Start", "End", "Elapsed", "NodeList", "ExitCode")
# squeue -O: "Field:|" means no padding and "|" as suffix. JobArrayID prints "6_1" / "11+0" like sacct.
SQUEUE_FIELDS = ("JobArrayID", "State", "Reason", "SubmitTime", "StartTime", "EndTime", "TimeUsed", "NodeList",
                 "RestartCnt")  # fmt: skip

_JOB_ID_RE = re.compile(r"^\d+(?:_\d+|_\[[0-9,\-%]+\]|\+\d+)?$")
_NO_VALUE = frozenset({"", "None", "none", "Unknown", "N/A", "(null)", "None assigned", "INVALID", "UNLIMITED"})


@attrs.frozen
class JobInfo:
    """What the scheduler says about one job (its latest run when it was requeued).

    Times are timezone-aware (Slurm prints the local time of the machine running the command).
    ``start_time``/``end_time`` are ``None`` while the job is pending (Slurm shows estimates there).
    """

    job_id: str
    state: str
    """Normalised Slurm state: ``COMPLETED``, ``PENDING``, ``RUNNING``, ``CANCELLED`` (never ``CANCELLED by 0``),
    ``REQUEUED``, ``TIMEOUT``, ... or ``UNKNOWN`` when no record of this job was found."""
    reason: str | None = None
    """Why it waits or ended (``Priority``, ``BeginTime``, ``JobHeldUser``, ``Resources``); ``None`` when running."""
    submit_time: _dt.datetime | None = None
    start_time: _dt.datetime | None = None
    end_time: _dt.datetime | None = None
    elapsed_s: float | None = None
    nodelist: str | None = None
    """Compressed host list (``n[1-2]``); expand it with ``expand_hostnames``."""
    exit_code: str | None = None
    """``"code:signal"`` as Slurm prints it (``"0:0"``, ``"1:0"``, ``"0:15"``)."""
    restart_count: int | None = None
    """How many times the job was requeued (0 for a first run)."""
    source: str = "sacct"
    """Where the answer came from: ``sacct``, ``squeue``, ``scontrol`` or ``none``."""

    @property
    def is_finished(self) -> bool:
        return self.state in FINISHED_STATES


# ---------------------------------------------------------------------------------------------
# Pure parsers


def _parse_time(value: str, what: str) -> _dt.datetime | None:
    value = value.strip()
    if value in _NO_VALUE:
        return None
    try:
        # A naive time is local time: astimezone() attaches the local zone.
        return _dt.datetime.fromisoformat(value).astimezone()
    except ValueError:
        raise SchedulerError(f"unexpected time {value!r} in {what} output") from None


def _parse_duration(value: str) -> float | None:
    """``[D-]HH:MM:SS``, ``MM:SS`` or ``M:SS`` (with optional fractional seconds) -> seconds."""
    value = value.strip()
    if value in _NO_VALUE:
        return None
    try:
        days, _, clock = value.rpartition("-")
        parts = [float(p) for p in clock.split(":")]
        if not 1 <= len(parts) <= 3:
            raise ValueError(value)
        day_s = int(days) * 86400 if days else 0
    except ValueError:
        raise SchedulerError(f"unexpected duration {value!r} in Slurm output") from None
    seconds = 0.0
    for p in parts:
        seconds = seconds * 60 + p
    return day_s + seconds


def _state(value: str) -> str:
    # sacct prints "CANCELLED by 0"; truncated columns end in "+".
    words = value.split()
    return words[0].rstrip("+").upper() if words else "UNKNOWN"


def _reason(value: str, state: str) -> str | None:
    value = value.strip().strip("()")
    # sacct keeps the last pending reason on a running job ("BeginTime" after a requeue): not a reason any more.
    if value in _NO_VALUE or state == "RUNNING":
        return None
    return value


def _opt(value: str) -> str | None:
    value = value.strip()
    return None if value in _NO_VALUE else value


def _info(job_id: str, state: str, reason: str, submit: str, start: str, end: str, elapsed: str, nodelist: str,
          exit_code: str | None, restarts: str | None, source: str) -> JobInfo:  # fmt: skip
    st = _state(state)
    pending = st == "PENDING"
    return JobInfo(
        job_id=job_id.strip(),
        state=st,
        reason=_reason(reason, st),
        submit_time=_parse_time(submit, source),
        start_time=None if pending else _parse_time(start, source),
        end_time=None if pending else _parse_time(end, source),
        elapsed_s=_parse_duration(elapsed),
        nodelist=_opt(nodelist),
        exit_code=_opt(exit_code) if exit_code is not None else None,
        restart_count=int(restarts) if restarts not in (None, "", "N/A") else None,
        source=source,
    )


def parse_sacct_rows(text: str) -> list[JobInfo]:
    """Every row of ``sacct --parsable2 --noheader -X -D -o <SACCT_FIELDS>``, in output order."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS):
            raise SchedulerError(f"unexpected sacct line (want {len(SACCT_FIELDS)} fields {SACCT_FIELDS}): {line!r}")
        jid, state, reason, submit, start, end, elapsed, nodelist, exit_code = parts
        rows.append(_info(jid, state, reason, submit, start, end, elapsed, nodelist, exit_code, None, "sacct"))
    return rows


def _is_stale(info: JobInfo, submitted_after: Mapping[str, _dt.datetime | None] | None, slack_s: float) -> bool:
    """True when the record predates the submission the caller recorded: an older job with a reused id."""
    if not submitted_after or info.submit_time is None:
        return False
    after = submitted_after.get(info.job_id) or submitted_after.get(_base_id(info.job_id))
    if after is None:
        return False
    return info.submit_time < after.astimezone() - _dt.timedelta(seconds=slack_s)


def _base_id(job_id: str) -> str:
    return re.split(r"[_+]", job_id, maxsplit=1)[0]


def parse_sacct(
    text: str,
    *,
    submitted_after: Mapping[str, _dt.datetime | None] | None = None,
    clock_slack_s: float = CLOCK_SLACK_S,
) -> dict[str, JobInfo]:
    """Latest record per job id from ``sacct ... -D`` output (all records of requeued jobs).

    A job requeued N times has N+1 records (the older ones in state ``REQUEUED``, ``PREEMPTED`` or
    ``NODE_FAIL``); the one with the latest submit time wins and ``restart_count`` counts the others.
    Records submitted before ``submitted_after[job_id]`` (minus ``clock_slack_s``) belong to an older
    job with the same id: they are dropped, and a job left with none is reported ``UNKNOWN``.
    """
    groups: dict[str, list[tuple[int, JobInfo]]] = {}
    for i, row in enumerate(parse_sacct_rows(text)):
        groups.setdefault(row.job_id, []).append((i, row))
    out: dict[str, JobInfo] = {}
    floor = _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)
    for job_id, rows in groups.items():
        kept = [(i, r) for i, r in rows if not _is_stale(r, submitted_after, clock_slack_s)]
        if not kept:
            out[job_id] = JobInfo(job_id=job_id, state="UNKNOWN", source="sacct")
            continue
        _, latest = max(kept, key=lambda ir: (ir[1].submit_time or floor, ir[0]))
        # Right after a requeue accounting holds only the old record (REQUEUED) until the job runs again.
        restarts = len(kept) - 1 + (1 if latest.state == "REQUEUED" else 0)
        out[job_id] = attrs.evolve(latest, restart_count=restarts)
    return out


def parse_squeue(
    text: str,
    *,
    submitted_after: Mapping[str, _dt.datetime | None] | None = None,
    clock_slack_s: float = CLOCK_SLACK_S,
) -> dict[str, JobInfo]:
    """``squeue --noheader --states=all -O <each of SQUEUE_FIELDS as "Field:|">`` output, one job per line."""
    out: dict[str, JobInfo] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if parts and parts[-1].strip() == "":
            parts = parts[:-1]  # every field ends with the "|" suffix
        if len(parts) != len(SQUEUE_FIELDS):
            raise SchedulerError(f"unexpected squeue line (want {len(SQUEUE_FIELDS)} fields {SQUEUE_FIELDS}): {line!r}")
        jid, state, reason, submit, start, end, used, nodelist, restarts = parts
        info = _info(jid, state, reason, submit, start, end, used, nodelist, None, restarts.strip(), "squeue")
        if not _is_stale(info, submitted_after, clock_slack_s):
            out[info.job_id] = info
    return out


# Keys look like "JobId", "AllocNode:Sid", "CPUs/Task", "ReqB:S:C:T"; values may hold "=" ("TRES=cpu=1,node=1").
_KEY_VALUE_RE = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_/:]*)=(.*?)(?=\s+[A-Za-z][A-Za-z0-9_/:]*=|\s*$)", re.S)


def _scontrol_records(text: str) -> list[dict[str, str]]:
    records: list[dict[str, str]] = []
    for chunk in re.split(r"(?:^|\s)(?=JobId=)", text):
        if not chunk.strip():
            continue
        fields = {m.group(1): m.group(2).strip() for m in _KEY_VALUE_RE.finditer(chunk.strip())}
        if "JobId" in fields:
            records.append(fields)
    return records


def parse_scontrol_show_job(text: str) -> dict[str, JobInfo]:
    """``scontrol show job [-o] [ID]`` output (multi-line or one line per job) -> JobInfo per job id.

    Array tasks are keyed ``<ArrayJobId>_<ArrayTaskId>`` and heterogeneous components
    ``<HetJobId>+<HetJobOffset>``, as sacct and squeue print them.
    """
    out: dict[str, JobInfo] = {}
    for f in _scontrol_records(text):
        jid = f["JobId"]
        if f.get("ArrayJobId") and f.get("ArrayTaskId") not in (None, "", "N/A"):
            task = f["ArrayTaskId"]
            jid = f"{f['ArrayJobId']}_{task}" if task.isdigit() else f"{f['ArrayJobId']}_[{task}]"
        elif f.get("HetJobId") and f.get("HetJobOffset") not in (None, "", "N/A"):
            jid = f"{f['HetJobId']}+{f['HetJobOffset']}"
        out[jid] = _info(
            jid, f.get("JobState", ""), f.get("Reason", ""), f.get("SubmitTime", ""), f.get("StartTime", ""),
            f.get("EndTime", ""), f.get("RunTime", ""), f.get("NodeList", ""), f.get("ExitCode"),
            f.get("Restarts"), "scontrol",
        )  # fmt: skip
    return out


def parse_sbatch(text: str) -> str:
    """Job id from ``sbatch`` output: ``Submitted batch job 123`` or ``--parsable``'s ``123`` / ``123;cluster``."""
    m = re.search(r"Submitted batch job (\d+)", text)
    if m:
        return m.group(1)
    for line in reversed(text.strip().splitlines()):
        m = re.fullmatch(r"\s*(\d+)(?:;\S+)?\s*", line)
        if m:
            return m.group(1)
    raise SchedulerError(f"could not find a job id in sbatch's output: {text.strip()!r}")


# ---------------------------------------------------------------------------------------------
# Running commands


def _which(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SchedulerError(
            f"{name} not found on PATH; is this a Slurm login node? The site's scheduler is slurm",
            hint="load the Slurm module, or use a site with scheduler = \"local\"",
        )
    return path


def _run(argv: Sequence[str], *, timeout_s: float = COMMAND_TIMEOUT_S,
         cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run a Slurm command; ``SchedulerError`` (with its stderr) when it fails or does not answer in time."""
    exe = _which(argv[0])
    # Users may set SLURM_TIME_FORMAT=relative; our parsers need ISO times.
    env = {**os.environ, "SLURM_TIME_FORMAT": "standard"}
    cmd = shlex.join(argv)
    try:
        proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout_s, env=env,
                              cwd=cwd, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise SchedulerError(f"`{cmd}` did not answer within {timeout_s:g} s (is slurmctld up?)") from None
    if proc.returncode != 0:
        detail = proc.stderr.strip() or proc.stdout.strip() or "no output"
        raise SchedulerError(f"`{cmd}` failed (exit {proc.returncode}): {detail}")
    return proc


def _check_id(job_id: str) -> str:
    job_id = str(job_id).strip()
    if not _JOB_ID_RE.fullmatch(job_id):
        raise SchedulerError(f"invalid Slurm job id {job_id!r} (want digits, optionally _TASK or +OFFSET)")
    return job_id


def sbatch_path() -> str:
    """Absolute path of ``sbatch``; ``SchedulerError`` when it is not on PATH."""
    return _which("sbatch")


def submit_script(path: str | os.PathLike[str], extra_args: Sequence[str] = (), *, cwd: str | os.PathLike[str] | None = None,
                  timeout_s: float = COMMAND_TIMEOUT_S) -> str:  # fmt: skip
    """``sbatch --parsable [extra_args] PATH``; returns the job id.

    Runs are submitted through submitit (:func:`hpcppo.launch.submit.submit_slurm`), which has no fallback to
    this. It submits plain scripts: the tests against the dev cluster (``tests/slurm``) use it.
    """
    proc = _run(["sbatch", "--parsable", *extra_args, os.fspath(path)], timeout_s=timeout_s, cwd=cwd)
    return parse_sbatch(proc.stdout)


def cancel(job_id: str, *, signal: str | None = None) -> None:
    """``scancel [--signal=SIG] ID``. Cancelling a job that already ended is not an error."""
    argv = ["scancel", _check_id(job_id)]
    if signal is not None:
        if not re.fullmatch(r"[A-Z0-9]+", signal):
            raise SchedulerError(f"invalid signal name {signal!r} (want e.g. USR2, TERM)")
        argv.insert(1, f"--signal={signal}")
    _run(argv)


_STEP_ID_RE = re.compile(r"^\d+(?:_\d+|\+\d+)?\.\d+$")


def parse_step_ids(text: str) -> list[str]:
    """``squeue --steps --noheader -o %i`` output -> the srun steps (``123.0``), without ``123.batch``/``.extern``."""
    return [line.strip() for line in text.splitlines() if _STEP_ID_RE.fullmatch(line.strip())]


def job_steps(job_id: str) -> list[str]:
    """The job's running srun steps (``[]`` once the controller no longer knows the job)."""
    try:
        proc = _run(["squeue", "--steps", "--noheader", "-j", _check_id(job_id), "-o", "%i"])
    except SchedulerError as exc:
        if "Invalid job id" in str(exc):
            return []
        raise
    return parse_step_ids(proc.stdout)


def cancel_step(step_id: str) -> None:
    """``scancel JOB.STEP``: ends one srun step (SIGTERM, SIGKILL after KillWait); the batch script goes on."""
    step_id = str(step_id).strip()
    if not _STEP_ID_RE.fullmatch(step_id):
        raise SchedulerError(f"invalid Slurm step id {step_id!r} (want JOBID.STEP, e.g. 123.0)")
    _run(["scancel", step_id])


def requeue(job_id: str, *, hold: bool = False) -> None:
    """``scontrol requeue ID`` (or ``requeuehold``): back to PENDING; Slurm adds a ~2 min BeginTime (see ``update_start_now``)."""
    _run(["scontrol", "requeuehold" if hold else "requeue", _check_id(job_id)])


def release(job_id: str) -> None:
    """``scontrol release ID``: let a held job (``JobHeldUser``/``JobHeldAdmin``) be scheduled."""
    _run(["scontrol", "release", _check_id(job_id)])


def update_start_now(job_id: str, *, delay_s: int = 2) -> None:
    """``scontrol update JobId=ID StartTime=now+DELAY``: skip the ~2 min BeginTime a requeue adds.

    Call it once the requeued job is PENDING (an update while it is still COMPLETING is overwritten
    by the requeue's BeginTime). The small delay matters: slurmd refuses to launch a job in the same
    second in which it revoked the previous run's credential, and the job then FAILS at once
    ("Killing non-startable batch JobId=...: Job credential revoked", exit 1:0).
    """
    if not 0 <= delay_s <= 3600:
        raise SchedulerError(f"delay_s must be between 0 and 3600 seconds, got {delay_s}")
    _run(["scontrol", "update", f"JobId={_check_id(job_id)}", f"StartTime=now+{int(delay_s)}"])


def batch_script(job_id: str) -> str:
    """The script Slurm stored for the job (``scontrol write batch_script ID -``)."""
    proc = _run(["scontrol", "write", "batch_script", _check_id(job_id), "-"])
    # Slurm 22.05 exits 0 even when the job is unknown ("job script retrieval failed: ...").
    if not proc.stdout and proc.stderr.strip():
        raise SchedulerError(f"could not read the batch script of job {job_id}: {proc.stderr.strip()}")
    return proc.stdout


def expand_hostnames(nodelist: str) -> list[str]:
    """``n[1-2],gpu07`` -> ``["n1", "n2", "gpu07"]`` (``scontrol show hostnames``)."""
    nodelist = nodelist.strip()
    if not nodelist or nodelist.startswith("-") or any(c.isspace() for c in nodelist):
        raise SchedulerError(f"invalid Slurm node list {nodelist!r}")
    return _run(["scontrol", "show", "hostnames", nodelist]).stdout.split()


def show_job(job_id: str) -> JobInfo | None:
    """``scontrol show job -o ID``: what the controller holds (``None`` once it forgot the job)."""
    job_id = _check_id(job_id)
    try:
        proc = _run(["scontrol", "show", "job", "-o", job_id])
    except SchedulerError as exc:
        if "Invalid job id" in str(exc):
            return None
        raise
    infos = parse_scontrol_show_job(proc.stdout)
    return infos.get(job_id) or next(iter(infos.values()), None)


def _sacct(ids: Sequence[str], submitted_after: Mapping[str, _dt.datetime | None] | None, timeout_s: float) -> dict[str, JobInfo]:
    # -D: every record of a requeued job; -X: allocations only, no steps. With -j, sacct looks back to the epoch.
    proc = _run(["sacct", "--parsable2", "--noheader", "-X", "-D", "-o", ",".join(SACCT_FIELDS), "-j", ",".join(ids)],
                timeout_s=timeout_s)  # fmt: skip
    return parse_sacct(proc.stdout, submitted_after=submitted_after)


def _squeue(ids: Sequence[str], submitted_after: Mapping[str, _dt.datetime | None] | None, timeout_s: float) -> dict[str, JobInfo]:
    fmt = ",".join(f"{f}:|" for f in SQUEUE_FIELDS)
    try:
        proc = _run(["squeue", "--noheader", "--states=all", "-j", ",".join(ids), "-O", fmt], timeout_s=timeout_s)
    except SchedulerError as exc:
        if "Invalid job id" in str(exc):  # none of the ids is known to the controller any more
            return {}
        raise
    return parse_squeue(proc.stdout, submitted_after=submitted_after)


def _lookup(infos: Mapping[str, JobInfo], job_id: str) -> JobInfo | None:
    # A heterogeneous job "123" is reported per component; its leader "123+0" speaks for it.
    return infos.get(job_id) or infos.get(f"{job_id}+0")


def query_jobs(
    job_ids: Iterable[str],
    *,
    submitted_after: Mapping[str, _dt.datetime | None] | None = None,
    timeout_s: float = COMMAND_TIMEOUT_S,
) -> dict[str, JobInfo]:
    """State of several jobs, with one ``sacct`` and at most one ``squeue`` call for all of them.

    ``submitted_after`` maps a job id to the time the caller submitted that attempt: older records
    with the same id (a reused id) are ignored. Every requested id is in the result; one that no
    source knows is ``UNKNOWN`` with source ``none``. ``SchedulerError`` only when neither sacct
    nor squeue answered.
    """
    ids = list(dict.fromkeys(_check_id(j) for j in job_ids))
    if not ids:
        return {}
    result: dict[str, JobInfo] = {}
    errors: list[str] = []
    try:
        from_sacct = _sacct(ids, submitted_after, timeout_s)
        for j in ids:
            info = _lookup(from_sacct, j)
            if info is not None:
                result[j] = info
    except SchedulerError as exc:  # accounting disabled or slurmdbd down: the controller still knows live jobs
        errors.append(str(exc))
    live = [j for j in ids if j not in result or not result[j].is_finished]
    if live:
        try:
            from_squeue = _squeue(live, submitted_after, timeout_s)
        except SchedulerError as exc:
            errors.append(str(exc))
            from_squeue = {}
        for j in live:
            info = _lookup(from_squeue, j)
            if info is None:
                continue
            if info.is_finished and info.exit_code is None:
                # squeue has no exit code; the controller still holds the finished job for MinJobAge.
                info = show_job(info.job_id) or info
            result[j] = info
    if len(errors) == 2:
        raise SchedulerError("could not query Slurm jobs: " + "; ".join(errors))
    for j in ids:
        result.setdefault(j, JobInfo(job_id=j, state="UNKNOWN", source="none"))
    return result
