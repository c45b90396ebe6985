"""``hpcppo follow``: the view's numbers, following a metric log that a writer subprocess is still growing, the
rich display, and Ctrl-C, which detaches and never touches the job. A real local run: tests/e2e/test_seeing_runs.py."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from hpcppo.analysis import follow as fl
from hpcppo.cli import main
from hpcppo.errors import HpcppoError, RunStateError
from hpcppo.launch import jobs, status
from hpcppo.rundir import RunDir

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"

# Logs one row per line read on stdin ("rollback" re-logs from step 3, "event" adds one), answers "ok <step>".
WRITER = r"""
import sys
from hpcppo.metrics import STANDARD_COLUMNS, MetricsWriter

w = MetricsWriter(sys.argv[1], STANDARD_COLUMNS, attempt=0)
step = 0
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "rollback":
        w.log_event(step, "watchdog.rollback", f"kl spike at step {step}; back to checkpoint step 2")
        step = 2
        continue
    if cmd == "event":
        w.log_event(step, "watchdog.raise_kl_coef", "kl_coef 0.001 -> 0.0015")
    step += 1
    w.log(step, {"reward/mean": step / 10, "kl/actor_ref": 0.02 * step, "kl/coef": 0.001,
                 "perf/tokens_per_s": 1000.0 + step})
    print("ok", step, flush=True)
w.close()
"""


def make_run(tmp_path: Path, total_steps: int = 6) -> tuple[Path, RunDir]:
    runs = tmp_path / "runs"
    crun = jobs.compile_run(ARITH, "local", [f"trainer.total_steps={total_steps}"], runs_root=str(runs),
                            check_paths=False)
    return runs, crun.run


# ----------------------------------------------------------------------------- the numbers shown
def rows(steps, times, attempt=0):
    return pd.DataFrame({"step": steps, "time": times, "attempt": attempt, "seq": range(len(steps)),
                         "reward/mean": [0.1 * s for s in steps], "kl/actor_ref": 0.05, "kl/coef": 0.001})


def test_eta_from_the_step_rate_of_the_newest_attempt():
    frame = pd.concat([rows([1, 2], [0.0, 100.0]), rows([3, 4, 5], [1000.0, 1002.0, 1004.0], attempt=1)])
    assert fl.eta_s(frame, 10) == pytest.approx(2.0 * 5)  # 2 s a step in attempt 1; attempt 0's pace ignored
    assert fl.eta_s(frame, 5) == 0.0
    assert fl.eta_s(rows([1], [0.0]), 10) is None and fl.eta_s(frame, None) is None


def test_view_and_plain_line():
    v = fl.make_view("RUNNING", rows([1, 2, 3], [0.0, 2.0, 4.0]), 10, 65.0)
    assert (v.step, v.total, v.reward, v.kl, v.kl_coef, v.tokens_per_s) == (3, 10, pytest.approx(0.3), 0.05, 0.001, None)
    assert fl.plain_line(v) == ("  step 3/10  elapsed 0:01:05  eta 0:00:14  reward 0.3  kl 0.05  kl_coef 0.001  "
                                "tok/s -")
    empty = fl.make_view("PENDING (Priority)", rows([], []), None, None)
    assert empty.step is None and fl.steps_text(empty) == "step -/?"
    # A split run's rows also say how stale its samples were and how long the trainers waited for them.
    split = rows([1, 2, 3], [0.0, 2.0, 4.0]).assign(**{"rollout/staleness_mean": 1.0, "time/trainer_idle_s": 0.25})
    assert fl.metrics_text(fl.make_view("RUNNING", split, 10, 65.0)).endswith("staleness 1  trainer idle 0.25 s")


# ----------------------------------------------------------------------------- a log that grows while we follow
class Scripted:
    """The status function of a fake job: each call makes the writer do the next thing of ``script``; RUNNING
    until the script is done, then COMPLETED. Records what had been printed when each call was made."""

    def __init__(self, run: RunDir, script: list[str], out: io.StringIO):
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER, str(run.path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.script, self.out, self.seen = list(script), out, []

    def __call__(self, run: RunDir) -> dict:
        self.seen.append(self.out.getvalue())
        state = "RUNNING"
        if self.script:
            cmd = self.script.pop(0)
            if cmd == "pending":
                state = "PENDING"
            else:
                self.proc.stdin.write(cmd + "\n")
                self.proc.stdin.flush()
                if cmd != "rollback":
                    self.proc.stdout.readline()
        else:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
            state = "COMPLETED"
        return status.JobStatus(run_id=run.run_id, path=str(run.path), site="local", scheduler="local", attempts=1,
                                state=state, reason="Priority" if state == "PENDING" else None, elapsed_s=5.0)


def test_follows_a_log_while_a_writer_process_grows_it(tmp_path):
    _, run = make_run(tmp_path)
    out = io.StringIO()
    job = Scripted(run, ["pending", "pending", "row", "row", "event", "row", "rollback", "row", "row", "row"], out)
    st = fl.follow(run, out=out, live=False, poll_s=0.05, status_every_s=0.0, get_status=job)
    assert st.state == "COMPLETED"
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0] == "  PENDING (Priority)" and "  RUNNING" in lines and lines[-1] == "  COMPLETED"
    steps = [line.split()[1] for line in lines if line.startswith("  step ")]
    assert steps == ["1/6", "2/6", "3/6", "4/6", "3/6", "4/6", "5/6"]  # rows as they came, the rollback's too
    assert "  event at step 2: watchdog.raise_kl_coef: kl_coef 0.001 -> 0.0015" in lines
    assert "  event at step 4: watchdog.rollback: kl spike at step 4; back to checkpoint step 2" in lines
    assert "reward 0.5  kl 0.1  kl_coef 0.001  tok/s 1,005" in lines[-2]
    # read live: each row was on screen while the writer had not logged the next one yet
    for k in (1, 2, 3):
        assert any(f"step {k}/6" in seen and f"step {k + 1}/6" not in seen for seen in job.seen), k


def test_rich_display_on_a_terminal(tmp_path):
    _, run = make_run(tmp_path)
    out = io.StringIO()
    job = Scripted(run, ["row", "event", "row"], out)
    assert fl.follow(run, out=out, live=True, poll_s=0.05, status_every_s=0.0, get_status=job).state == "COMPLETED"
    text = out.getvalue()
    assert "\x1b[" in text and "━" in text  # colours and a bar
    assert "step 3/6" in text and "reward 0.3" in text and "watchdog.raise_kl_coef" in text and "COMPLETED" in text


def test_a_run_never_submitted_is_one_line(tmp_path, capsys):
    runs, run = make_run(tmp_path)
    with pytest.raises(RunStateError, match="never submitted"):
        fl.follow(run, out=io.StringIO())
    assert main(["follow", run.run_id, "--runs-root", str(runs)]) == 8
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["follow", "nope", "--runs-root", str(runs)]) == 6


# ----------------------------------------------------------------------------- Ctrl-C
def fake_controller(run: RunDir) -> subprocess.Popen:
    """A process that status takes for the local job's submitit controller (its command line names submitit
    and the run's submitit folder): the run is RUNNING while it lives."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "submitit",
                             str(run.submitit)])


def test_ctrl_c_detaches_and_the_job_goes_on(tmp_path):
    runs, run = make_run(tmp_path)
    controller = fake_controller(run)
    try:
        run.add_attempt(job_id=str(controller.pid), scheduler="local", state="RUNNING", kind="submit")
        proc = subprocess.Popen([sys.executable, "-m", "hpcppo.cli", "follow", run.run_id, "--runs-root", str(runs),
                                 "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "  RUNNING\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode in (0, 130)
        assert f"detached from {run.run_id}: the job goes on" in err and "Traceback" not in err
        time.sleep(0.5)
        assert controller.poll() is None  # never signalled
        assert "cancel_requested_at" not in run.read_record()["attempts"][-1]
    finally:
        controller.kill()
        controller.wait()


def test_a_local_job_is_started_in_a_session_of_its_own():
    """The controller of a local job must not be in the terminal's session: Ctrl-C there must not reach it."""
    from hpcppo.launch import submit

    sid, pgid = submit._in_new_session(lambda: f"{os.getsid(0)} {os.getpgid(0)}").split()
    assert int(sid) != os.getsid(0) and int(pgid) != os.getpgid(0)

    def refused():
        raise RunStateError("refused by the scheduler")

    with pytest.raises(HpcppoError, match="refused by the scheduler") as info:
        submit._in_new_session(refused)
    assert info.value.exit_code == RunStateError.exit_code

