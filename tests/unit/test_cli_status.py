"""``hpcppo status`` / ``cancel`` against stand-in ``sacct``/``squeue``/``scancel`` executables on PATH.

The stand-ins print what a test wrote into files, so each test decides what "Slurm" answers: a record
of an older job with the same id (a reused id), accounting disabled, a held job, nothing at all.
The real cluster is exercised in tests/slurm/test_launch_*.py.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.errors import RunStateError
from hpcppo.launch import status
from hpcppo.rundir import RunDir

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"
JOB = "4242"


class FakeSlurm:
    """Each command prints ``<name>.out``, writes ``<name>.err`` to stderr, exits with ``<name>.rc``,
    and appends its arguments to ``calls.log``."""

    def __init__(self, root: Path):
        self.dir = root
        root.mkdir()
        for name in ("sacct", "squeue", "scancel", "scontrol"):
            script = root / name
            script.write_text(
                "#!/bin/sh\n"
                f'echo "{name} $*" >> "{root}/calls.log"\n'
                f'[ -f "{root}/{name}.out" ] && cat "{root}/{name}.out"\n'
                f'[ -f "{root}/{name}.err" ] && cat "{root}/{name}.err" >&2\n'
                f'exit "$(cat "{root}/{name}.rc" 2>/dev/null || echo 0)"\n'
            )
            script.chmod(0o755)

    def answer(self, name: str, out: str = "", *, rc: int = 0, err: str = "") -> None:
        (self.dir / f"{name}.out").write_text(out)
        (self.dir / f"{name}.err").write_text(err)
        (self.dir / f"{name}.rc").write_text(str(rc))

    def calls(self) -> list[str]:
        log = self.dir / "calls.log"
        return log.read_text().splitlines() if log.exists() else []


def slurm_time(t: dt.datetime) -> str:
    return t.astimezone().replace(tzinfo=None).isoformat(timespec="seconds")


def sacct_line(state: str, submit: dt.datetime, *, reason: str = "None", elapsed: str = "00:01:05") -> str:
    return f"{JOB}|{state}|{reason}|{slurm_time(submit)}|{slurm_time(submit)}|Unknown|{elapsed}|n[1-2]|0:0\n"


def squeue_line(state: str, reason: str, submit: dt.datetime, restarts: int = 0) -> str:
    t = slurm_time(submit)
    return f"{JOB}|{state}|{reason}|{t}|N/A|N/A|0:00||{restarts}|\n"  # empty NodeList while pending


@pytest.fixture()
def env(tmp_path, monkeypatch):
    fake = FakeSlurm(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{fake.dir}:/usr/bin:/bin")
    runs = tmp_path / "runs"
    assert main(["compile", str(ARITH), "--site", "local-slurm", "--no-check-paths", "-q", "--runs-root", str(runs)]) == 0
    [path] = runs.iterdir()
    run = RunDir.open(runs, path.name)
    submitted = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    run.add_attempt(job_id=JOB, scheduler="slurm", state="PENDING", kind="submit", submitted_at=submitted.isoformat())
    return fake, runs, run, submitted


def status_json(capsys, runs: Path, run: RunDir) -> dict:
    capsys.readouterr()
    assert main(["status", run.run_id, "--json", "--runs-root", str(runs)]) == 0
    return json.loads(capsys.readouterr().out)


def test_reused_job_id_never_reports_the_old_jobs_state(env, capsys):
    fake, runs, run, submitted = env
    old = submitted - dt.timedelta(days=30)
    fake.answer("sacct", sacct_line("COMPLETED", old))
    fake.answer("squeue", squeue_line("COMPLETED", "None", old))
    st = status_json(capsys, runs, run)
    assert st["state"] == "UNKNOWN" and st["job_id"] == JOB
    # ... and the record is not marked with the old job's outcome
    assert run.read_record()["attempts"][-1]["state"] == "PENDING"


def test_a_record_from_our_own_submission_is_reported(env, capsys):
    """The control case of the test above: same answer, submit time after ours."""
    fake, runs, run, submitted = env
    fake.answer("sacct", sacct_line("COMPLETED", submitted + dt.timedelta(seconds=1)))
    (run.control / f"exit-code.{JOB}.0").write_text("0\n")  # rank 0: all steps done (COMPLETED needs it)
    st = status_json(capsys, runs, run)
    assert (st["state"], st["source"], st["elapsed_s"], st["restarts"]) == ("COMPLETED", "sacct", 65.0, 0)
    assert not any(c.startswith("squeue") for c in fake.calls())  # a finished job needs no second query
    # the final state is kept in run.json for when the scheduler has forgotten the job
    attempt = run.read_record()["attempts"][-1]
    assert attempt["state"] == "COMPLETED" and "state_seen_at" in attempt
    fake.answer("sacct", "")
    fake.answer("squeue", rc=1, err="slurm_load_jobs error: Invalid job id specified")
    st = status_json(capsys, runs, run)
    assert (st["state"], st["source"]) == ("COMPLETED", "run.json")
    assert "no longer knows" in st["reason"]


def test_without_accounting_squeue_answers_with_the_pending_reason(env, capsys):
    fake, runs, run, submitted = env
    fake.answer("sacct", rc=1, err="sacct: error: Slurm accounting storage is disabled")
    fake.answer("squeue", squeue_line("PENDING", "Priority", submitted))
    st = status_json(capsys, runs, run)
    assert (st["state"], st["reason"], st["source"]) == ("PENDING", "Priority", "squeue")
    assert main(["status", run.run_id, "--runs-root", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "state       PENDING (Priority)   [from squeue]" in out
    assert "site        local-slurm (slurm)" in out and f"job         {JOB}" in out and "attempts    1" in out
    # the table of all runs shows the same
    assert main(["status", "--runs-root", str(runs)]) == 0
    table = capsys.readouterr().out
    assert run.run_id in table and "PENDING (Priority)" in table and "local-slurm" in table


def test_requeued_and_held(env, capsys):
    fake, runs, run, submitted = env
    fake.answer("sacct", rc=1, err="sacct: error: Slurm accounting storage is disabled")
    fake.answer("squeue", squeue_line("PENDING", "JobHeldUser", submitted + dt.timedelta(seconds=30), restarts=1))
    st = status_json(capsys, runs, run)
    assert (st["state"], st["reason"], st["restarts"]) == ("PENDING", "JobHeldUser", 1)


def test_scheduler_unreachable_is_unknown_with_the_reason(env, capsys):
    fake, runs, run, _ = env
    fake.answer("sacct", rc=1, err="sacct: error: slurm_persist_conn_open_without_init: failed to open persistent connection")
    fake.answer("squeue", rc=1, err="slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
    st = status_json(capsys, runs, run)
    assert st["state"] == "UNKNOWN" and "Unable to contact slurm controller" in st["reason"]


def test_cancel_sends_scancel_only_for_a_live_job(env, capsys):
    fake, runs, run, submitted = env
    fake.answer("sacct", sacct_line("RUNNING", submitted))
    capsys.readouterr()
    assert main(["cancel", run.run_id, "--runs-root", str(runs)]) == 0
    assert f"cancel requested for job {JOB}" in capsys.readouterr().out
    assert f"scancel {JOB}" in fake.calls()
    assert "cancel_requested_at" in run.read_record()["attempts"][-1]
    fake.answer("sacct", sacct_line("CANCELLED", submitted, reason="None"))
    n_calls = len(fake.calls())
    assert main(["cancel", run.run_id, "--runs-root", str(runs)]) == 0
    assert "already ended (CANCELLED)" in capsys.readouterr().out
    assert not any(c.startswith("scancel") for c in fake.calls()[n_calls:])


def test_cancel_of_a_run_never_submitted(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["compile", str(ARITH), "--site", "local", "--no-check-paths", "-q", "--runs-root", str(runs)]) == 0
    [path] = runs.iterdir()
    capsys.readouterr()
    assert main(["cancel", path.name, "--runs-root", str(runs)]) == RunStateError.exit_code
    err = capsys.readouterr().err
    assert "was never submitted" in err and len(err.strip().splitlines()) == 1
    assert status.run_status(RunDir.open(runs, path.name)).state == "NOT_SUBMITTED"


@pytest.mark.parametrize(("overrides", "roles"), [
    ([], "2 ranks, colocated"),
    (["-o", 'rollout.placement="split"', "-o", "resources.rollout_ranks_per_node=1"],
     "1 trainer + 1 rollout ranks, split, max_staleness 1"),
])
def test_status_shows_the_ranks_roles(tmp_path, capsys, overrides, roles):
    """A split run's status says which ranks train and which generate (issue 35), from its resolved.toml."""
    runs = tmp_path / "runs"
    assert main(["compile", str(ARITH), "--site", "local", "--no-check-paths", "-q", "--runs-root", str(runs),
                 *overrides]) == 0
    [path] = runs.iterdir()
    capsys.readouterr()
    assert main(["status", path.name, "--runs-root", str(runs)]) == 0
    assert f"ranks       {roles}\n" in capsys.readouterr().out


def test_status_of_one_run_shows_its_last_events(env, capsys):
    from hpcppo.rundir import events

    fake, runs, run, submitted = env
    fake.answer("sacct", sacct_line("RUNNING", submitted + dt.timedelta(seconds=1)))
    for i in range(12):
        events.append_event(run.path, kind="watchdog.raise_kl_coef", step=i, source="watchdog",
                            message=f"kl_raise_coef: kl/actor_ref=0.{i:02d} > 0.05", value=float("nan"))
    events.append_event(run.path, kind="watchdog.rollback", step=12, source="watchdog",
                        message="kl_rollback: kl/actor_ref=0.083 > 0.05; back to checkpoint step 10", checkpoint=10)
    capsys.readouterr()
    assert main(["status", run.run_id, "--runs-root", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "last 10 events (events.jsonl):" in out
    assert "step    12  watchdog.rollback" in out and "back to checkpoint step 10" in out
    assert "kl/actor_ref=0.02 " not in out and "kl/actor_ref=0.03 " in out  # only the last 10
    st = status_json(capsys, runs, run)
    assert [e["step"] for e in st["events"]] == list(range(3, 13))
    assert st["events"][0]["value"] == "nan"  # strict JSON


def test_status_json_prints_the_job_status_fields_in_their_order_then_the_detail(env, capsys):
    """``status --json`` is the typed ``JobStatus`` (field by field, in order: scripts read it) plus the run's
    records; a field added, renamed or moved changes this list on purpose only."""
    fake, runs, run, submitted = env
    fake.answer("sacct", sacct_line("RUNNING", submitted + dt.timedelta(seconds=1)))
    st = status_json(capsys, runs, run)
    assert list(st) == ["run_id", "path", "site", "scheduler", "attempts", "job_id", "submitted_at", "state", "reason",
                        "elapsed_s", "restarts", "source", "latest_checkpoint", "total_steps", "steps_done",
                        "exit_record", "exit_reason", "resumable", "paused", "moved_from", "monitor", "roles",
                        "attempt_records", "events", "damaged_checkpoints"]
    assert list(st)[:22] == [f.name for f in status.JobStatus.__attrs_attrs__]
    assert (st["state"], st["job_id"], st["source"], st["elapsed_s"]) == ("RUNNING", JOB, "sacct", 65)
    assert st["monitor"].startswith("not alive (no heartbeat in 0:01:05 of this attempt")
