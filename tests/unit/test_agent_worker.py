"""The tool worker with real processes: a raising tool is an error observation counted per tool, a crashing or
hanging one costs the worker (restarted), not the caller, and no process outlives its owner, killed or not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hpcppo.agent.tool import ToolSpec
from hpcppo.agent.worker import ToolWorker, ToolWorkerError, wait_gone

HERE = Path(__file__).resolve().parent
FIXTURE = "agent_tools_fixture"


@pytest.fixture(autouse=True)
def _fixture_importable(monkeypatch):
    # the spawned worker imports the fixture tools by import path: it needs the folder on its path too
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))


def _specs(*names: str) -> list[ToolSpec]:
    return [ToolSpec(f"{FIXTURE}.{n}") for n in names]


def test_state_lives_in_the_worker_per_trajectory_and_errors_are_counted_per_tool():
    with ToolWorker(_specs("Counter", "Raises"), call_timeout_s=10) as w:
        a, b = w.create("counter", {"start": 10}), w.create("counter")
        assert w.execute(a, {"x": 5}).text.startswith("sum=15")
        out = w.execute(b, {"x": 1})
        assert out.text.startswith("sum=1") and out.reward == 0.5 and out.metrics == {"n": 1.0}
        assert f"pid={w.pid}" in out.text and w.pid != os.getpid()
        assert w.calc_reward(a) == 15.0
        r = w.create("raises")
        bad = w.execute(r, {})
        assert bad.error == "raised" and "ValueError: bug in the tool" in bad.text
        assert w.counts["raises"]["errors"] == 1 and w.counts["counter"]["calls"] == 2
        w.release(a)
        assert w.execute(b, {"x": 1}).text.startswith("sum=2")  # the other trajectory's state is intact


def test_a_crashing_tool_costs_the_worker_which_is_restarted():
    with ToolWorker(_specs("Crashes", "Counter"), call_timeout_s=10) as w:
        first = w.pid
        keep = w.create("counter", {"start": 1})
        out = w.execute(w.create("crashes"), {})
        assert out.error == "crashed" and "exit code 3" in out.text
        assert w.pid != first and wait_gone(first, 5)
        assert w.counts["crashes"]["crashes"] == 1 and w.counts["crashes"]["restarts"] == 1
        lost = w.execute(keep, {"x": 1})  # its state died with the old worker: said so, not silently reset
        assert lost.error == "lost_state"
        assert w.execute(w.create("counter"), {"x": 2}).text.startswith("sum=2")


def test_a_hanging_tool_times_out_and_the_worker_is_replaced():
    with ToolWorker(_specs("Hangs", "Counter"), call_timeout_s=1.0) as w:
        first = w.pid
        t0 = time.monotonic()
        out = w.execute(w.create("hangs"), {})
        assert out.error == "timeout" and time.monotonic() - t0 < 60  # not the hang, on a busy machine too
        assert wait_gone(first, 5) and w.counts["hangs"]["timeouts"] == 1
        assert w.execute(w.create("counter"), {"x": 3}).text.startswith("sum=3")


@pytest.mark.parametrize("name, expect", [
    ("BadCtor", "constructor failed: RuntimeError: no such resource"),
    ("Missing", "has no class Missing"),
    ("NotATool", "is not a subclass of hpcppo.agent.tool.Tool"),
])
def test_a_tool_that_does_not_load_fails_the_start_in_one_line(name, expect):
    with pytest.raises(ToolWorkerError) as err:
        ToolWorker(_specs(name))
    assert expect in str(err.value) and "\n" not in str(err.value)


OWNER = textwrap.dedent("""
    import sys, time
    from hpcppo.agent.tool import ToolSpec
    from hpcppo.agent.worker import ToolWorker
    if __name__ == "__main__":  # the spawned worker imports this module again
        w = ToolWorker([ToolSpec("agent_tools_fixture.Hangs"), ToolSpec("hpcppo.agent.builtin.PythonRunner",
                        {"wall_s": 600, "cpu_s": 600})], call_timeout_s=600)
        print(w.pid, flush=True)
        if sys.argv[1] == "busy-tool":
            w.execute(w.create("hangs"), {})
        elif sys.argv[1] == "busy-sandbox":
            w.execute(w.create("python"), {"code": "import time; time.sleep(600)"})
        time.sleep(600)
""")

@pytest.mark.parametrize("state", ["idle", "busy-tool", "busy-sandbox"])
def test_no_process_outlives_its_owner_killed_with_sigkill(tmp_path, state):
    marker = f"owner-{os.getpid()}-{time.time_ns()}"
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    # a killed owner cannot remove its worker's scratch directory: let it land in the test's own directory
    env = dict(os.environ, TMPDIR=str(tmp_path))
    owner = subprocess.Popen([sys.executable, str(script), state, marker], stdout=subprocess.PIPE, text=True, env=env)
    assert owner.stdout is not None
    worker = int(owner.stdout.readline())
    time.sleep(1.0)  # the call is running
    tree: list[int] = []
    if state == "busy-sandbox":
        deadline = time.monotonic() + 10
        while not any("-I main.py" in _cmd(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
            tree = _descendants(worker)
        assert any("-I main.py" in _cmd(p) for p in tree), "the sandboxed call did not start"
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert wait_gone(worker, 10), f"the tool worker {worker} outlived its owner"
    left = [p for p in tree if not wait_gone(p, 10)]
    assert left == [], f"sandbox processes outlived their owner: {[_cmd(p) for p in left]}"


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (the sandbox's launcher, shell and interpreter under the worker)."""
    children: dict[int, list[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_the_example_tool_in_the_docs_works(tmp_path, monkeypatch):
    """docs/tools.md's example, run as written in a tool worker: per-trajectory state and step rewards."""
    import re

    doc = (HERE.parents[1] / "docs" / "tools.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc, re.DOTALL)
    assert code is not None and 15 <= len(code.group(1).strip().splitlines()) <= 25
    (tmp_path / "doc_example_tools.py").write_text(code.group(1))
    monkeypatch.syspath_prepend(str(tmp_path))  # the spawned worker starts with its owner's sys.path
    with ToolWorker([ToolSpec("doc_example_tools.GuessNumber")]) as w:
        a, b = w.create("guess", {"secret": 7}), w.create("guess")
        assert [w.execute(a, {"n": n}).text for n in (3, 9, 7)] == ["higher", "lower", "correct"]
        assert w.execute(a, {"n": 7}).reward == 1.0 and w.execute(b, {"n": 7}).reward == -0.1
        assert (w.calc_reward(a), w.calc_reward(b)) == (1.0, 0.0)


def test_the_worker_does_not_import_what_its_owner_has(tmp_path):
    """A rank's main module imports torch; its worker is a fresh interpreter with the tools only (multiprocessing's
    spawn would import the rank's main module again, torch with it). A stand-in module marks the owner's imports."""
    (tmp_path / "agent_owner_heavy.py").write_text("")
    owner = tmp_path / "owner_main.py"
    owner.write_text(textwrap.dedent("""
        import agent_owner_heavy  # the owner's heavy import, at the top of its main module
        from hpcppo.agent.tool import ToolSpec
        from hpcppo.agent.worker import ToolWorker
        if __name__ == "__main__":
            with ToolWorker([ToolSpec("agent_tools_fixture.Modules")]) as w:
                print("worker has:", w.execute(w.create("modules"), {}).text)
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ["PYTHONPATH"]]))
    proc = subprocess.run([sys.executable, str(owner)], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "worker has:"


def test_a_call_cut_off_by_a_restart_leaves_no_directory():
    """The sandbox removes a call's directory when the call ends; a worker killed in the middle of one cannot, so
    the worker's scratch directory (its TMPDIR) is emptied at the restart and removed at close."""
    spec = ToolSpec("hpcppo.agent.builtin.PythonRunner", {"wall_s": 60, "cpu_s": 60})
    with ToolWorker([spec], call_timeout_s=1.5) as w:
        scratch = Path(w.scratch)
        out = w.execute(w.create("python"), {"code": "import time\ntime.sleep(60)"})
        assert out.error == "timeout" and scratch.is_dir() and list(scratch.iterdir()) == []
        assert w.execute(w.create("python"), {"code": "print(1)"}).text == "1\n"
        assert list(scratch.iterdir()) == []
    assert not scratch.exists()
    with pytest.raises(ToolWorkerError):
        ToolWorker(_specs("BadCtor"))
