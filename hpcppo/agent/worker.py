"""The tool-worker process of a rank: it hosts the tool instances (per-trajectory state lives there), so that a
tool's bug costs an error observation and a tool's crash or hang costs the worker, which is restarted, not the rank.

IPC: a socket pair wrapped as ``multiprocessing.connection.Connection`` (requests and replies as pickled tuples, one
request at a time). The worker is a fresh interpreter (``python -c`` + :func:`main`), not a fork (a rank holds torch
and threads) nor multiprocessing's ``spawn``, which would import the rank's main module, and with it torch, again:
the worker imports this module and the tools only. It gets the rank's ``sys.path`` in its first message, so a tool
importable in the rank is importable there. The rank's side is :class:`ToolWorker`.

The worker ends with its owner: ``PR_SET_PDEATHSIG`` (SIGKILL when the owner dies, even mid-call), checked
against a race by comparing the parent pid after setting it, and the request loop leaves on the pipe's end of file.
The sandbox it starts dies with it (``hpcppo.agent.sandbox``: the launcher's death signal, the PID namespace).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing.connection
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hpcppo.agent.tool import Tool, ToolLoadError, ToolSpec, build_tool

__all__ = ["ToolWorker", "ToolOutcome", "ToolWorkerError"]

_PR_SET_PDEATHSIG = 1


class ToolWorkerError(Exception):
    """The worker cannot start (a tool does not load); one line."""


@dataclass
class ToolOutcome:
    """One call's result as the model sees it: ``text`` (an error observation when ``error`` is set: raised,
    crashed, timeout, lost_state, unknown_tool), the step reward and the tool's metrics."""

    text: str
    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    error: str = ""


def _die_with(owner: int) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != owner:  # the owner died before the death signal was set
        os._exit(0)


def main(fd: int, owner: int) -> None:
    """The worker process's entry point: ``fd`` is its end of the socket pair, ``owner`` the rank's pid."""
    _die_with(owner)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the rank, which closes the worker
    conn = multiprocessing.connection.Connection(fd)
    try:
        path, specs = conn.recv()
    except (EOFError, OSError):
        return
    sys.path[:] = path
    _serve(conn, specs, owner)


def _serve(conn: multiprocessing.connection.Connection, specs: list[ToolSpec], owner: int) -> None:
    """Build the tools, then answer requests until the connection closes or the owner is gone."""
    tools: dict[str, Tool] = {}
    try:
        for spec in specs:
            tool = build_tool(spec)
            tools[tool.name] = tool
    except ToolLoadError as exc:
        conn.send(("init_error", str(exc)))
        return
    conn.send(("ready", sorted(tools)))
    while True:
        try:
            if not conn.poll(1.0):
                if os.getppid() != owner:
                    return
                continue
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request[0] == "close":
            return
        conn.send(_handle(tools, request))


def _handle(tools: dict[str, Tool], request: tuple[Any, ...]) -> tuple[Any, ...]:
    op, name, *args = request
    tool = tools.get(name)
    if tool is None:
        return ("raised", f"unknown tool {name!r}; known: {', '.join(sorted(tools))}")
    try:
        # Each operation's last argument is the row's keyword arguments of that phase (hpcppo.agent.kwargs), passed
        # flat, as verl's BaseTool methods take **kwargs.
        if op == "create":
            return ("ok", tool.create(args[0], **args[1]))
        if op == "execute":
            text, reward, metrics = tool.execute(args[0], args[1], **args[2])
            return ("ok", (str(text), float(reward), {str(k): float(v) for k, v in (metrics or {}).items()}))
        if op == "calc_reward":
            return ("ok", float(tool.calc_reward(args[0], **args[1])))
        if op == "release":
            tool.release(args[0], **args[1])
            return ("ok", None)
        return ("raised", f"unknown operation {op!r}")
    except Exception as exc:  # noqa: BLE001 - a bug in the user's tool becomes an error observation
        return ("raised", f"{type(exc).__name__}: {exc}")


_ENTRY = "import sys; from hpcppo.agent.worker import main; main(int(sys.argv[1]), int(sys.argv[2]))"


class ToolWorker:
    """The rank's handle on its tool worker: start, the four tool operations, restart on a crash or hang, close.

    ``counts`` holds per tool: ``calls``, ``errors`` (raised), ``lost_state`` (an instance of a restarted worker), ``crashes``, ``timeouts``, ``restarts`` (of the
    worker, counted on the tool whose call cost it).
    """

    def __init__(self, specs: list[ToolSpec], *, call_timeout_s: float = 60.0, start_timeout_s: float = 60.0):
        self.specs = list(specs)
        self.call_timeout_s = call_timeout_s
        self.start_timeout_s = start_timeout_s
        self.counts: dict[str, Counter[str]] = {}
        self.generation = 0  # instances live in one generation of the worker
        self._instances: dict[str, tuple[str, int]] = {}
        # The worker's TMPDIR: the sandbox's call directories go there, and a worker killed in the middle of a
        # call leaves its directory behind; emptied at each restart, removed by close(). Others may traverse it (a
        # root job's calls run as another user, in a directory of their own inside).
        self.scratch = tempfile.mkdtemp(prefix="hpcppo-tools-")
        os.chmod(self.scratch, 0o711)
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: multiprocessing.connection.Connection | None = None
        self.tool_names: list[str] = []
        try:
            self._start()
        except BaseException:
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        proc = subprocess.Popen([sys.executable, "-c", _ENTRY, str(theirs.fileno()), str(os.getpid())],
                                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                env=dict(os.environ, TMPDIR=self.scratch))
        theirs.close()
        mine = multiprocessing.connection.Connection(ours.detach())
        mine.send((list(sys.path), self.specs))
        if not mine.poll(self.start_timeout_s):
            proc.kill()
            proc.wait()
            mine.close()
            raise ToolWorkerError(f"the tool worker did not start within {self.start_timeout_s:g} s")
        try:
            kind, value = mine.recv()
        except EOFError:
            mine.close()
            raise ToolWorkerError(f"the tool worker died while loading the tools (exit code {proc.wait()})") from None
        if kind == "init_error":
            proc.wait()
            mine.close()
            raise ToolWorkerError(value)
        self._proc, self._conn, self.tool_names = proc, mine, list(value)
        self.generation += 1

    def _restart(self) -> None:
        self._stop(kill=True)
        for entry in os.listdir(self.scratch):
            shutil.rmtree(os.path.join(self.scratch, entry), ignore_errors=True)
        self._start()

    def _count(self, tool: str, what: str) -> None:
        self.counts.setdefault(tool, Counter())[what] += 1

    def _call(self, request: tuple[Any, ...]) -> tuple[str, Any]:
        """("ok", value) | ("raised", msg) | ("crashed", msg) | ("timeout", msg); restarts the worker on the last two."""
        assert self._conn is not None
        tool = request[1]
        try:
            self._conn.send(request)
            if self._conn.poll(self.call_timeout_s):
                reply: tuple[str, Any] = self._conn.recv()
                return reply
            kind, msg = "timeout", f"no answer within {self.call_timeout_s:g} s"
        except (EOFError, OSError, BrokenPipeError):
            assert self._proc is not None
            try:
                code: int | None = self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            kind, msg = "crashed", f"the tool worker died (exit code {code})"
        self._count(tool, {"timeout": "timeouts", "crashed": "crashes"}[kind])
        self._count(tool, "restarts")
        self._restart()
        return kind, msg

    def create(self, tool: str, kwargs: Mapping[str, Any] | None = None) -> str:
        """A new instance of ``tool`` for one trajectory: ``Tool.create(instance_id, **kwargs)`` in the worker (a
        row's ``create_kwargs``); ToolWorkerError when it fails."""
        instance_id = uuid.uuid4().hex
        kind, value = self._call(("create", tool, instance_id, dict(kwargs or {})))
        if kind != "ok":
            raise ToolWorkerError(f"tool {tool!r}: create failed: {value}")
        self._instances[instance_id] = (tool, self.generation)
        return instance_id

    def execute(self, instance_id: str, parameters: dict[str, Any],
                kwargs: Mapping[str, Any] | None = None) -> ToolOutcome:
        """One call, ``Tool.execute(instance_id, parameters, **kwargs)`` (a row's ``execute_kwargs``); never raises
        for what the tool does."""
        tool, generation = self._instances[instance_id]
        self._count(tool, "calls")
        if generation != self.generation:
            self._count(tool, "lost_state")
            return ToolOutcome(f"error: tool {tool!r} lost its state (its worker was restarted)", error="lost_state")
        kind, value = self._call(("execute", tool, instance_id, parameters, dict(kwargs or {})))
        if kind == "ok":
            text, reward, metrics = value
            return ToolOutcome(text, reward, metrics)
        if kind == "raised":
            self._count(tool, "errors")
        return ToolOutcome(f"error: tool {tool!r} failed: {value}", error=kind)

    def alive(self, instance_id: str) -> bool:
        """Whether the instance lives in the current worker (not lost with a restarted one)."""
        return self._instances[instance_id][1] == self.generation

    def calc_reward(self, instance_id: str, kwargs: Mapping[str, Any] | None = None) -> float | None:
        """``Tool.calc_reward(instance_id, **kwargs)`` (a row's ``calc_reward_kwargs``); None when the tool raised,
        crashed or hung (counted), or its instance was lost with a restarted worker."""
        tool, generation = self._instances[instance_id]
        if generation != self.generation:
            return None
        kind, value = self._call(("calc_reward", tool, instance_id, dict(kwargs or {})))
        if kind == "raised":
            self._count(tool, "errors")
        return float(value) if kind == "ok" else None

    def release(self, instance_id: str, kwargs: Mapping[str, Any] | None = None) -> None:
        """``Tool.release(instance_id, **kwargs)`` (a row's ``release_kwargs``); what the tool does is not reported
        (its state is dropped either way)."""
        tool, generation = self._instances.pop(instance_id)
        if generation == self.generation:
            self._call(("release", tool, instance_id, dict(kwargs or {})))

    def _stop(self, *, kill: bool) -> None:
        if self._proc is None:
            return
        if not kill and self._conn is not None:
            try:
                self._conn.send(("close",))
            except (OSError, BrokenPipeError):
                pass
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn = None, None

    def close(self) -> None:
        self._stop(kill=False)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self) -> ToolWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_gone(pid: int, timeout_s: float) -> bool:
    """True once ``pid`` no longer runs (a zombie counts as gone), within ``timeout_s``; for tests and checks."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            return True
        if state == b"Z":
            return True
        time.sleep(0.05)
    return False
