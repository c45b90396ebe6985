"""Parsers of Slurm's output, on literal strings captured from Slurm 22.05 (the dev cluster)."""

from __future__ import annotations

import datetime as dt
import os
import stat
import sys
from pathlib import Path

import pytest

from hpcppo.errors import SchedulerError
from hpcppo.launch import slurm


def local(text: str) -> dt.datetime:
    """Slurm prints naive local times; the parsers attach the local zone."""
    return dt.datetime.fromisoformat(text).astimezone()


# sacct --parsable2 --noheader -X -D -o JobID,State,Reason,Submit,Start,End,Elapsed,NodeList,ExitCode
SACCT_MIXED = """\
1|COMPLETED|None|2026-11-30T03:30:18|2026-11-30T03:30:18|2026-11-30T03:30:18|00:00:00|n[1-2]|0:0
3|PENDING|BeginTime|2026-11-30T03:30:18|Unknown|Unknown|00:00:00|None assigned|0:0
4|PENDING|JobHeldUser|2026-11-30T03:30:18|Unknown|Unknown|00:00:00|None assigned|0:0
5|CANCELLED by 0|None|2026-11-30T03:31:23|2026-11-30T03:31:23|2026-11-30T03:32:01|00:00:38|n1|0:15
8|FAILED|NonZeroExitCode|2026-11-30T03:40:00|2026-11-30T03:40:01|2026-11-30T03:40:03|00:00:02|n2|1:0
9|TIMEOUT|TimeLimit|2026-11-29T03:40:00|2026-11-29T03:40:01|2026-11-30T05:40:01|1-02:00:00|n[1-2]|0:0
"""

# Job 2 was requeued while running, then started again (two records; the requeue reset its submit time).
SACCT_REQUEUED_RAN_AGAIN = """\
2|REQUEUED|None|2026-11-30T03:30:18|2026-11-30T03:30:18|2026-11-30T03:30:27|00:00:09|n1|0:0
2|RUNNING|BeginTime|2026-11-30T03:30:27|2026-11-30T03:30:28|Unknown|00:00:02|n1|0:0
"""
# Right after the requeue, accounting holds only the old record.
SACCT_JUST_REQUEUED = """\
2|REQUEUED|None|2026-11-30T03:30:18|2026-11-30T03:30:18|2026-11-30T03:30:27|00:00:09|n1|0:0
"""

SACCT_ARRAY_HET = """\
11+0|PENDING|None|2026-11-30T03:31:31|Unknown|Unknown|00:00:00|None assigned|0:0
11+1|PENDING|None|2026-11-30T03:31:31|Unknown|Unknown|00:00:00|None assigned|0:0
6_1|COMPLETED|None|2026-11-30T03:31:31|2026-11-30T03:31:32|2026-11-30T03:31:32|00:00:00|n1|0:0
6_2|COMPLETED|None|2026-11-30T03:31:31|2026-11-30T03:31:32|2026-11-30T03:31:32|00:00:00|n2|0:0
"""


def test_sacct_states_times_and_fields():
    infos = slurm.parse_sacct(SACCT_MIXED)
    assert set(infos) == {"1", "3", "4", "5", "8", "9"}
    done = infos["1"]
    assert (done.state, done.reason, done.nodelist, done.exit_code, done.elapsed_s) == ("COMPLETED", None, "n[1-2]", "0:0", 0.0)
    assert done.submit_time == local("2026-11-30T03:30:18") and done.submit_time.tzinfo is not None
    assert done.is_finished and done.source == "sacct" and done.restart_count == 0
    assert infos["5"].state == "CANCELLED" and infos["5"].exit_code == "0:15" and infos["5"].elapsed_s == 38.0
    assert infos["8"].state == "FAILED" and infos["8"].reason == "NonZeroExitCode"
    assert infos["9"].state == "TIMEOUT" and infos["9"].elapsed_s == 26 * 3600.0


def test_sacct_pending_reasons_and_unknown_times():
    infos = slurm.parse_sacct(SACCT_MIXED)
    begin, held = infos["3"], infos["4"]
    assert (begin.state, begin.reason) == ("PENDING", "BeginTime")
    assert (held.state, held.reason) == ("PENDING", "JobHeldUser")
    assert begin.start_time is None and begin.end_time is None and begin.nodelist is None
    assert not begin.is_finished


def test_sacct_requeued_job_takes_latest_record_and_counts_restarts():
    info = slurm.parse_sacct(SACCT_REQUEUED_RAN_AGAIN)["2"]
    assert info.state == "RUNNING"
    assert info.restart_count == 1
    assert info.submit_time == local("2026-11-30T03:30:27")
    assert info.start_time == local("2026-11-30T03:30:28")
    assert info.end_time is None
    assert info.reason is None  # sacct's stale "BeginTime" on a running job is not a reason
    # The order of the records does not matter: the latest submit time wins.
    swapped = "".join(reversed(SACCT_REQUEUED_RAN_AGAIN.splitlines(keepends=True)))
    assert slurm.parse_sacct(swapped)["2"] == info


def test_sacct_just_requeued_counts_one_restart():
    info = slurm.parse_sacct(SACCT_JUST_REQUEUED)["2"]
    assert (info.state, info.restart_count, info.is_finished) == ("REQUEUED", 1, False)


def test_sacct_reused_job_id_with_older_submit_time_is_dropped():
    # Job 5 of an earlier controller life (submitted yesterday) vs. our attempt submitted today.
    old = "5|COMPLETED|None|2026-11-29T10:00:00|2026-11-29T10:00:01|2026-11-29T10:05:00|00:04:59|n1|0:0\n"
    ours = local("2026-11-30T03:31:23")
    assert slurm.parse_sacct(old, submitted_after={"5": ours})["5"].state == "UNKNOWN"
    # Both records present: only the new one counts, and it is not a restart of the old one.
    new = "5|RUNNING|None|2026-11-30T03:31:23|2026-11-30T03:31:24|Unknown|00:00:10|n2|0:0\n"
    info = slurm.parse_sacct(old + new, submitted_after={"5": ours})["5"]
    assert (info.state, info.restart_count, info.nodelist) == ("RUNNING", 0, "n2")
    # Without the recorded submit time the newest record still wins.
    assert slurm.parse_sacct(old + new)["5"].state == "RUNNING"
    assert slurm.parse_sacct(old + new, submitted_after={"5": None})["5"].restart_count == 1


def test_sacct_clock_slack_and_timezones():
    row = "7|COMPLETED|None|2026-11-30T03:30:18|2026-11-30T03:30:18|2026-11-30T03:30:20|00:00:02|n1|0:0\n"
    # Recorded on our clock a second or two after Slurm's truncated submit time: same job.
    recorded = local("2026-11-30T03:30:20").astimezone(dt.timezone.utc)  # aware UTC, as run.json stores it
    assert slurm.parse_sacct(row, submitted_after={"7": recorded})["7"].state == "COMPLETED"
    naive = dt.datetime.fromisoformat("2026-11-30T03:30:19")  # naive means local time
    assert slurm.parse_sacct(row, submitted_after={"7": naive})["7"].state == "COMPLETED"
    later = local("2026-11-30T03:30:30")
    assert slurm.parse_sacct(row, submitted_after={"7": later})["7"].state == "UNKNOWN"
    assert slurm.parse_sacct(row, submitted_after={"7": later}, clock_slack_s=60)["7"].state == "COMPLETED"


def test_sacct_array_and_het_ids():
    infos = slurm.parse_sacct(SACCT_ARRAY_HET)
    assert set(infos) == {"11+0", "11+1", "6_1", "6_2"}
    assert infos["6_2"].nodelist == "n2" and infos["11+1"].state == "PENDING"
    # A reused-id check against the het leader's recorded time applies to its components.
    later = local("2026-12-01T00:00:00")
    assert slurm.parse_sacct(SACCT_ARRAY_HET, submitted_after={"11": later})["11+1"].state == "UNKNOWN"


def test_sacct_rejects_unexpected_lines():
    with pytest.raises(SchedulerError, match="unexpected sacct line"):
        slurm.parse_sacct("1|COMPLETED|None\n")
    with pytest.raises(SchedulerError, match="unexpected time '2 hours ago'"):
        slurm.parse_sacct("1|COMPLETED|None|2 hours ago|Unknown|Unknown|00:00:00|n1|0:0\n")
    assert slurm.parse_sacct("") == {}


# squeue --noheader --states=all -O JobArrayID:|,State:|,Reason:|,SubmitTime:|,StartTime:|,EndTime:|,TimeUsed:|,NodeList:|,RestartCnt:|
SQUEUE = """\
1|COMPLETED|None|2026-11-30T03:30:18|2026-11-30T03:30:18|2026-11-30T03:30:18|0:00|n[1-2]|0|
3|PENDING|BeginTime|2026-11-30T03:30:18|2026-11-30T04:30:18|2026-11-30T05:30:18|0:00||0|
4|PENDING|JobHeldUser|2026-11-30T03:30:18|N/A|N/A|0:00||0|
2|RUNNING|None|2026-11-30T03:30:27|2026-11-30T03:30:28|2026-11-30T04:30:28|1:02:56|n1|1|
6_1|COMPLETED|None|2026-11-30T03:31:31|2026-11-30T03:31:32|2026-11-30T03:31:32|0:00|n1|0|
11+0|PENDING|Resources|2026-11-30T03:31:31|N/A|N/A|0:00||0|
"""


def test_squeue():
    infos = slurm.parse_squeue(SQUEUE)
    assert set(infos) == {"1", "2", "3", "4", "6_1", "11+0"}
    running = infos["2"]
    assert (running.state, running.restart_count, running.nodelist, running.reason) == ("RUNNING", 1, "n1", None)
    assert running.elapsed_s == 3776.0 and running.source == "squeue" and running.exit_code is None
    pending = infos["3"]
    # squeue shows an estimated start for a pending job: not a start time.
    assert (pending.state, pending.reason, pending.start_time, pending.nodelist) == ("PENDING", "BeginTime", None, None)
    assert infos["4"].reason == "JobHeldUser" and infos["11+0"].reason == "Resources"
    stale = slurm.parse_squeue(SQUEUE, submitted_after={"3": local("2026-11-30T09:00:00")})
    assert "3" not in stale and "4" in stale
    with pytest.raises(SchedulerError, match="unexpected squeue line"):
        slurm.parse_squeue("2|RUNNING|\n")


SCONTROL_MULTILINE = """\
JobId=3 JobName=wrap
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   Priority=4294901757 Nice=0 Account=root QOS=normal
   JobState=PENDING Reason=BeginTime Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   RunTime=00:00:00 TimeLimit=01:00:00 TimeMin=N/A
   SubmitTime=2026-11-30T03:30:18 EligibleTime=2026-11-30T04:30:18
   AccrueTime=2026-11-30T04:30:18
   StartTime=2026-11-30T04:30:18 EndTime=2026-11-30T05:30:18 Deadline=N/A
   Partition=debug AllocNode:Sid=localhost:3039
   ReqNodeList=(null) ExcNodeList=(null)
   NodeList=
   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   TRES=cpu=1,mem=24105M,node=1,billing=1
   Command=(null)
   WorkDir=/tmp/sl
   Power=

JobId=2 JobName=my sleep job
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 ExitCode=0:0
   RunTime=00:00:56 TimeLimit=01:00:00 TimeMin=N/A
   SubmitTime=2026-11-30T03:30:27 EligibleTime=2026-11-30T03:30:28
   StartTime=2026-11-30T03:30:28 EndTime=2026-11-30T04:30:28 Deadline=N/A
   NodeList=n1 BatchHost=n1
"""

SCONTROL_ONELINE = (
    "JobId=12 HetJobId=11 HetJobOffset=1 JobName=het.sh HetJobIdSet=11-12 UserId=root(0) JobState=CANCELLED "
    "Reason=None Requeue=1 Restarts=0 BatchFlag=1 ExitCode=0:15 RunTime=00:00:04 SubmitTime=2026-11-30T03:31:31 "
    "StartTime=2026-11-30T03:31:40 EndTime=2026-11-30T03:31:44 NodeList=n2\n"
    "JobId=13 ArrayJobId=6 ArrayTaskId=1 JobName=wrap JobState=COMPLETED Reason=None Restarts=0 ExitCode=0:0 "
    "RunTime=00:00:00 SubmitTime=2026-11-30T03:31:31 StartTime=2026-11-30T03:31:32 EndTime=2026-11-30T03:31:32 "
    "NodeList=n1\n"
    "JobId=14 ArrayJobId=14 ArrayTaskId=3-5 JobName=wrap JobState=PENDING Reason=Priority Restarts=0 ExitCode=0:0 "
    "RunTime=00:00:00 SubmitTime=2026-11-30T03:31:35 StartTime=Unknown EndTime=Unknown NodeList=(null)\n"
)


def test_scontrol_show_job_multiline():
    infos = slurm.parse_scontrol_show_job(SCONTROL_MULTILINE)
    assert set(infos) == {"2", "3"}
    pending = infos["3"]
    assert (pending.state, pending.reason, pending.restart_count, pending.start_time) == ("PENDING", "BeginTime", 0, None)
    assert pending.submit_time == local("2026-11-30T03:30:18") and pending.nodelist is None
    running = infos["2"]
    assert (running.state, running.restart_count, running.nodelist, running.elapsed_s) == ("RUNNING", 1, "n1", 56.0)
    assert running.exit_code == "0:0" and running.source == "scontrol"


def test_scontrol_show_job_oneline_array_and_het():
    infos = slurm.parse_scontrol_show_job(SCONTROL_ONELINE)
    assert set(infos) == {"11+1", "6_1", "14_[3-5]"}
    assert infos["11+1"].state == "CANCELLED" and infos["11+1"].exit_code == "0:15"
    assert infos["11+1"].end_time == local("2026-11-30T03:31:44")
    assert infos["14_[3-5]"].reason == "Priority"


def test_sbatch_output():
    assert slurm.parse_sbatch("Submitted batch job 123\n") == "123"
    assert slurm.parse_sbatch("123\n") == "123"
    assert slurm.parse_sbatch("123;hpcppo\n") == "123"
    assert slurm.parse_sbatch("sbatch: some warning\n456\n") == "456"
    with pytest.raises(SchedulerError, match="could not find a job id"):
        slurm.parse_sbatch("sbatch: error: Batch job submission failed: Invalid partition name specified\n")


def test_durations():
    assert slurm._parse_duration("1-02:03:04") == 93784.0
    assert slurm._parse_duration("02:03:04") == 7384.0
    assert slurm._parse_duration("3:04") == 184.0
    assert slurm._parse_duration("UNLIMITED") is None
    with pytest.raises(SchedulerError, match="unexpected duration"):
        slurm._parse_duration("2 hours")


def test_job_ids_are_validated_before_reaching_a_command():
    for bad in ("-v", "12; rm -rf /", "", "12 13", "abc"):
        with pytest.raises(SchedulerError, match="invalid Slurm job id"):
            slurm.cancel(bad)
    with pytest.raises(SchedulerError, match="invalid signal name"):
        slurm.cancel("12", signal="USR2 --full")


def _fake_bin(tmp_path: Path, name: str, script: str) -> None:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n{script}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture()
def fake_slurm(tmp_path, monkeypatch):
    """A PATH holding only fake Slurm commands (real programs, run as subprocesses)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    return tmp_path


def test_missing_binary_says_what_to_do(fake_slurm):
    with pytest.raises(SchedulerError) as err:
        slurm.sbatch_path()
    assert "sbatch not found on PATH; is this a Slurm login node?" in str(err.value)
    assert err.value.exit_code == 7


def test_query_falls_back_to_squeue_when_accounting_is_disabled(fake_slurm):
    _fake_bin(fake_slurm, "sacct", "import sys\nsys.stderr.write('sacct: error: Slurm accounting storage is disabled\\n')\nsys.exit(1)\n")
    _fake_bin(fake_slurm, "squeue", f"import sys\nsys.stdout.write({SQUEUE!r})\n")
    infos = slurm.query_jobs(["3", "2", "99"])
    assert infos["3"].state == "PENDING" and infos["3"].reason == "BeginTime" and infos["3"].source == "squeue"
    assert infos["2"].restart_count == 1
    assert infos["99"].state == "UNKNOWN" and infos["99"].source == "none"


def test_query_error_carries_both_stderrs(fake_slurm):
    _fake_bin(fake_slurm, "sacct", "import sys\nsys.stderr.write('sacct: error: Slurm accounting storage is disabled\\n')\nsys.exit(1)\n")
    _fake_bin(fake_slurm, "squeue", "import sys\nsys.stderr.write('slurm_load_jobs error: Unable to contact slurm controller\\n')\nsys.exit(1)\n")
    with pytest.raises(SchedulerError) as err:
        slurm.query_jobs(["3"])
    assert "Slurm accounting storage is disabled" in str(err.value)
    assert "Unable to contact slurm controller" in str(err.value)


def test_command_timeout(fake_slurm):
    _fake_bin(fake_slurm, "scontrol", "import time\ntime.sleep(30)\n")
    with pytest.raises(SchedulerError, match="did not answer within 0.5 s"):
        slurm._run(["scontrol", "ping"], timeout_s=0.5)


def test_time_format_is_forced_to_standard(fake_slurm, monkeypatch):
    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")
    _fake_bin(fake_slurm, "scontrol", "import os\nprint(os.environ['SLURM_TIME_FORMAT'])\n")
    assert slurm._run(["scontrol", "x"]).stdout.strip() == "standard"
    assert os.environ["SLURM_TIME_FORMAT"] == "relative"  # the caller's environment is untouched
