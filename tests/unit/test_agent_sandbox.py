"""The sandbox with real subprocesses: each misbehaving call gives an error status, the caller returns promptly,
and nothing of the call is left (processes, its directory)."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from hpcppo.agent.sandbox import SandboxLimits, SandboxResult, isolation, run_sandboxed

PY = "/usr/bin/python3" if isolation().as_root else sys.executable
FAST = SandboxLimits(wall_s=4.0, cpu_s=3, memory_bytes=256 * 2**20, max_processes=8, max_output_bytes=4096)


def run(code: str, limits: SandboxLimits = FAST, base: Path | None = None, marker: str = "") -> SandboxResult:
    """``marker`` goes on the command line, where _procs_of finds the call's processes (forks keep it)."""
    return run_sandboxed([PY, "-I", "main.py", *([marker] if marker else [])], limits, files={"main.py": code},
                         base_dir=str(base) if base else None)


def _procs_of(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_good_call_prints_and_leaves_no_directory(tmp_path):
    r = run("import os\nprint(6 * 7)\nprint(sorted(os.environ))", base=tmp_path)
    assert r.status == "ok" and r.stdout.splitlines()[0] == "42"
    env = eval(r.stdout.splitlines()[1])  # noqa: S307 - our own test output, a list literal
    assert not [k for k in env if k.startswith(("SLURM", "HPCPPO", "AWS", "HF_", "WANDB", "PYTHONPATH"))]
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "PWD", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING"}
    assert list(tmp_path.iterdir()) == []  # its directory is removed


def test_secrets_in_the_callers_environment_do_not_reach_the_code(monkeypatch):
    monkeypatch.setenv("HPCPPO_TEST_SECRET", "s3cret")
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    r = run("import os; print(os.environ.get('HPCPPO_TEST_SECRET'), os.environ.get('SLURM_JOB_ID'))")
    assert r.stdout.strip() == "None None"


def test_a_hanging_call_times_out_on_the_wall_clock_and_leaves_nothing():
    marker = f"hang-{os.getpid()}-{time.time_ns()}"
    t0 = time.monotonic()
    r = run(f"import time  # {marker}\ntime.sleep(600)", SandboxLimits(wall_s=1.5, cpu_s=3), marker=marker)
    assert r.status == "timeout" and time.monotonic() - t0 < 600  # not the 600 s sleep, on a busy machine too
    assert _procs_of(marker) == []


def test_a_cpu_bound_call_hits_the_cpu_limit():
    r = run("while True: pass", SandboxLimits(wall_s=120.0, cpu_s=1))  # wall far off: a busy machine is slow
    assert r.status == "cpu_limit", r


def test_a_crash_is_an_error_not_success():
    r = run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert r.status == "killed" and "signal 11" in r.detail


def test_a_memory_hungry_call_hits_the_memory_limit():
    r = run("x = bytearray(1024 * 2**20)")
    assert r.status == "memory" and "MemoryError" in r.stderr


def test_output_flooding_is_cut_and_the_call_killed():
    t0 = time.monotonic()
    r = run("while True: print('x' * 1000)", SandboxLimits(wall_s=20.0, max_output_bytes=10_000))
    assert r.status == "output_limit" and len(r.stdout) <= 10_000 and time.monotonic() - t0 < 60


def test_a_fork_bomb_stays_under_the_process_limit_and_dies_with_the_call():
    marker = f"bomb-{os.getpid()}-{time.time_ns()}"
    code = (f"import os, time  # {marker}\nn = 0\nfor _ in range(10000):\n    try:\n        if os.fork() == 0:\n"
            f"            time.sleep(600)\n        n += 1\n    except OSError:\n        break\nprint(n, flush=True)\n"
            f"time.sleep(600)")
    r = run(code, SandboxLimits(wall_s=3.0, cpu_s=3, max_processes=8), marker=marker)
    assert r.status == "timeout"
    if isolation().as_root:  # as `nobody`, who runs nothing else here: at most 8 processes, the shell included
        assert 0 < int(r.stdout.strip()) < 8 and r.user == "nobody"
    assert _procs_of(marker) == []


@pytest.mark.skipif(not isolation().as_root, reason="as an ordinary user the code may write wherever the job's "
                                                   "user can (docs/tools.md): only a root job drops to another user")
def test_writing_outside_its_directory_fails(tmp_path):
    target = tmp_path / "outside.txt"
    os.chmod(tmp_path, 0o777)  # world-writable: only the user's identity or the mount namespace keeps it out
    r = run(f"open({str(target)!r}, 'w').write('x')\nprint('wrote')")
    assert not target.exists()
    assert r.status == "error" and ("PermissionError" in r.stderr or "FileNotFoundError" in r.stderr)
    r = run("open('/work/hpcppo-sandbox-escape', 'w').write('x')")  # a root-owned directory
    assert r.status == "error" and "PermissionError" in r.stderr and not Path("/work/hpcppo-sandbox-escape").exists()
    # the host's /tmp is not reachable: the call's /tmp is its own directory, removed afterwards
    probe = Path(tempfile.gettempdir()) / f"hpcppo-probe-{os.getpid()}"
    r = run(f"open('/tmp/{probe.name}', 'w').write('x')\nimport os\nprint(os.listdir('/tmp'))")
    assert r.status == "ok" and probe.name in r.stdout and not probe.exists()


def test_the_network_is_unreachable():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3)
    port = server.getsockname()[1]
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(_accept(server)))
    thread.start()
    r = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')")
    thread.join()
    server.close()
    if isolation().network_isolated:
        assert r.status == "error" and accepted == [False] and "connected" not in r.stdout
    else:  # documented: without namespaces the network is reachable, and the result says so
        assert not r.network_isolated


def _accept(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not isolation().as_root, reason="checks the drop to the unprivileged user, which needs root")
def test_as_root_the_code_runs_as_the_unprivileged_user():
    r = run("import os; print(os.getuid(), os.getgid(), os.getgroups())")
    import pwd

    entry = pwd.getpwnam("nobody")
    assert r.stdout.strip() == f"{entry.pw_uid} {entry.pw_gid} []"
    missing = run_sandboxed([PY, "-c", "1"], SandboxLimits(user="no-such-user-hpcppo"))
    assert missing.status == "failed_to_start" and "no-such-user-hpcppo" in missing.detail


UNPRIVILEGED = """
import json, sys
from hpcppo.agent.sandbox import SandboxLimits, isolation, run_sandboxed
limits = SandboxLimits(wall_s=3, cpu_s=3, max_processes=8)
bomb = ("import os, time\\nn = 0\\nfor _ in range(1000):\\n    try:\\n        if os.fork() == 0:\\n"
        "            time.sleep(600)\\n        n += 1\\n    except OSError:\\n        break\\nprint(n, flush=True)\\n"
        "time.sleep(600)")
out = {"isolation": [isolation().as_root, isolation().user_namespaces]}
for name, code in [("net", "import socket; socket.create_connection(('127.0.0.1', 9), timeout=1)"), ("bomb", bomb)]:
    r = run_sandboxed([sys.executable, "-I", "main.py", sys.argv[1]], limits, files={"main.py": code})
    out[name] = [r.status, r.stdout.strip(), r.network_isolated]
print(json.dumps(out))
"""


@pytest.mark.skipif(not isolation().as_root or not Path("/usr/bin/python3").exists(),
                    reason="becoming an unprivileged caller needs root (the other tests run as the caller they are)")
def test_an_unprivileged_caller_gets_the_process_limit_and_namespaces():
    """The job's user is not root: no user switch, but RLIMIT_NPROC holds a fork bomb, and where user namespaces
    are allowed (here) the PID and network namespaces still apply."""
    import json
    import subprocess

    marker = f"unpriv-{os.getpid()}-{time.time_ns()}"
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", "-i",
                           "PATH=/usr/bin:/bin", f"PYTHONPATH={Path(__file__).resolve().parents[2]}",
                           "/usr/bin/python3", "-c", UNPRIVILEGED, marker], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["isolation"][0] is False
    assert out["bomb"][0] == "timeout" and 0 < int(out["bomb"][1]) < 8  # its forks failed under the limit
    if out["isolation"][1]:
        assert out["net"][0] == "error" and out["net"][2] is True
    assert _procs_of(marker) == []


@pytest.mark.skipif(not isolation().as_root, reason="the refusal concerns a caller that is root")
def test_as_root_without_util_linux_the_code_is_not_run(monkeypatch):
    from hpcppo.agent import sandbox

    monkeypatch.setattr(sandbox, "isolation", lambda: sandbox.Isolation(True, False, None, None))
    r = run("print('ran')")
    assert r.status == "failed_to_start" and "not run as root" in r.detail and r.stdout == ""


def test_the_python_tool_answers_with_the_output_or_the_error_and_a_metric():
    from hpcppo.agent.builtin import PythonRunner

    tool = PythonRunner({"wall_s": 2.0, "cpu_s": 2}, None)
    text, reward, metrics = tool.execute("i", {"code": "print(sum(range(10)))"})
    assert (text, reward, metrics["sandbox/ok"]) == ("45\n", 0.0, 1.0)
    text, _, metrics = tool.execute("i", {"code": "print('partial', flush=True)\nraise KeyError('k')"})
    assert text.startswith("partial\n\nerror: error (exit status 1)") and "KeyError: 'k'" in text
    assert metrics["sandbox/error"] == 1.0
    text, _, metrics = tool.execute("i", {"code": "import time\ntime.sleep(60)"})
    assert text == "error: timeout (wall-clock limit of 2 s)" and metrics["sandbox/timeout"] == 1.0
    with pytest.raises(ValueError, match="unknown config key 'wall'"):
        PythonRunner({"wall": 1}, None)


def test_stdin_reaches_the_code_and_a_large_unread_stdin_does_not_block():
    r = run_sandboxed([PY, "-I", "-c", "import sys; print(sys.stdin.read().upper())"], FAST, stdin="abc")
    assert r.stdout == "ABC\n"
    t0 = time.monotonic()
    r = run_sandboxed([PY, "-I", "-c", "import time; time.sleep(600)"], SandboxLimits(wall_s=2.0),
                      stdin="x" * 10_000_000)
    assert r.status == "timeout" and time.monotonic() - t0 < 60
