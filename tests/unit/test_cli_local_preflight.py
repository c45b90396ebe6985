"""The embedded local default: ``hpcppo preflight --site local`` runs 2 gloo ranks through submitit's
local executor and the same entry point as a Slurm job; ``status`` reads the local job's state, and
``cancel`` stops a local run's whole process tree."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.launch import status
from hpcppo.rundir import list_runs

pytestmark = pytest.mark.slow


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live (non-zombie) processes that contain ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(ln for ln in (proc / "status").read_text().splitlines() if ln.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if text in cmdline and "Z" not in state.split()[1]:
            found.append(cmdline)
    return found


def test_local_preflight_and_status(tmp_path, capsys):
    root = tmp_path / "runs"
    rc = main(["preflight", "--site", "local", "-q", "--runs-root", str(root)])
    out = capsys.readouterr().out
    assert rc == 0, out
    [run] = list_runs(root)
    assert "preflight OK: world size 2 on " in out and "(gloo)" in out
    report = json.loads((run.path / "preflight.json").read_text())
    assert report["world_size"] == 2 and report["checks"]["ranks"] == {"ok": True, "seen": [0, 1]}
    assert report["checks"]["allreduce"]["ok"]
    # the ranks ran the rendered local script, which runs the job entry point with the run directory
    assert f"-m hpcppo.train.main {run.path}" in run.script.read_text()
    [attempt] = run.read_record()["attempts"]
    logs = run.logs / f"attempt-local-{attempt['job_id']}"
    assert sorted(p.name for p in logs.iterdir()) == ["rank-0.log", "rank-1.log", "versions.json"]
    # the job recorded what it ran with (hpcppo.train.versions), as the preflight's rank records do
    import importlib.metadata

    import torch

    versions = json.loads(run.versions(f"local-{attempt['job_id']}").read_text())
    assert versions["torch"] == torch.__version__ and versions["cuda"] == torch.version.cuda
    assert versions["transformers"] == importlib.metadata.version("transformers")
    assert {r["transformers"] for r in report["ranks"]} == {versions["transformers"]}

    capsys.readouterr()
    assert main(["status", run.run_id, "--json", "--runs-root", str(root)]) == 0
    st = json.loads(capsys.readouterr().out)
    assert (st["site"], st["scheduler"], st["state"], st["source"], st["attempts"]) == ("local", "local", "COMPLETED", "local", 1)
    assert st["job_id"] == attempt["job_id"] and st["elapsed_s"] > 0
    assert run.read_record()["attempts"][0]["state"] == "COMPLETED"
    assert main(["status", "--runs-root", str(root)]) == 0
    assert run.run_id in capsys.readouterr().out


@pytest.mark.parametrize("submitter_sigint", ["default", "ignored"])
def test_local_cancel_stops_every_process_of_the_run(tmp_path, capsys, submitter_sigint):
    """``ignored``: submitted from a process that ignores SIGINT, as any background job of a script (``cmd &``) or
    nohup does; that disposition is inherited across exec and would make the job deaf to the cancel."""
    root = tmp_path / "runs"
    tag = f"{317 + os.getpid() % 1000 + (submitter_sigint == 'ignored')}"  # a sleep duration no other process uses
    before = signal.getsignal(signal.SIGINT)
    if submitter_sigint == "ignored":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        rc = main(["preflight", "--site", "local", "-q", "--no-wait", "--runs-root", str(root),
                   "-o", f'site.env.setup=["sleep {tag}"]'])  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, before)
    assert rc == 0, capsys.readouterr().err
    [run] = list_runs(root)
    deadline = time.monotonic() + 60
    while len([c for c in _processes_mentioning(f"sleep {tag}") if c.startswith("sleep")]) < 2:
        assert time.monotonic() < deadline, "the two ranks never reached their setup line"
        time.sleep(0.2)
    assert status.run_status(run).state == "RUNNING"
    capsys.readouterr()
    assert main(["cancel", run.run_id, "--runs-root", str(root)]) == 0
    assert "(was RUNNING)" in capsys.readouterr().out
    deadline = time.monotonic() + 30
    while _processes_mentioning(f"sleep {tag}") or _processes_mentioning(str(run.path)):
        assert time.monotonic() < deadline, _processes_mentioning(f"sleep {tag}") + _processes_mentioning(str(run.path))
        time.sleep(0.2)
    st = status.run_status(run)
    assert st.state == "CANCELLED" and "cancel requested at" in st.reason
    # the controller's own output went to the run's log, not to the submitting terminal
    assert (run.logs / "local-controller.log").exists()


def _rank_wrappers(run_dir: Path) -> list[int]:
    """Pids of submitit's task processes (our rank wrappers) of this run."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"submitit.core._submit" in cmdline and os.fsencode(str(run_dir / "submitit")) in cmdline:
                pids.append(int(proc.name))
    return pids


def test_time_limit_signal_reaches_every_ranks_process_group(tmp_path, capsys):
    """submitit's USR2 (its time limit is near) goes to what each rank runs, as Slurm's --signal does:
    here a setup line that does not trap it, so both ranks end by the signal."""
    import signal

    root = tmp_path / "runs"
    tag = f"{318 + os.getpid() % 1000}"
    assert main(["preflight", "--site", "local", "-q", "--no-wait", "--runs-root", str(root),
                 "-o", f'site.env.setup=["sleep {tag}"]']) == 0  # fmt: skip
    [run] = list_runs(root)
    deadline = time.monotonic() + 60
    while len([c for c in _processes_mentioning(f"sleep {tag}") if c.startswith("sleep")]) < 2:
        assert time.monotonic() < deadline, "the two ranks never reached their setup line"
        time.sleep(0.2)
    wrappers = _rank_wrappers(run.path)
    assert len(wrappers) == 2
    for pid in wrappers:
        os.kill(pid, signal.SIGUSR2)
    st = status.wait_for(run, poll_s=0.3, timeout_s=30)
    assert st.state == "FAILED" and "was ended by SIGUSR2" in st.reason, st
    assert not _processes_mentioning(f"sleep {tag}")
