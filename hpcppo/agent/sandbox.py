"""Run untrusted code (a model's tool call) in a fresh, limited subprocess; never hang or kill the caller.

Each call gets its own temporary directory (its working directory, ``HOME`` and ``TMPDIR``; removed afterwards),
an environment with nothing of the caller's (``PATH``, ``HOME``, ``TMPDIR``, ``LANG`` only: no secrets, no Slurm
or job variables), and ``resource.setrlimit`` limits set in the child before it runs: CPU seconds (``RLIMIT_CPU``),
address space (``RLIMIT_AS``), processes of its user (``RLIMIT_NPROC``), file size (``RLIMIT_FSIZE``), open files
and no core dumps. The caller adds a wall-clock deadline and an output cap (stdout and stderr are read through
pipes; the process group is killed when either is exceeded).

Isolation depends on who runs the job (:func:`isolation`):

- **root** (containers, some clusters): root ignores ``RLIMIT_NPROC``, so the code runs as an unprivileged user
  (``nobody`` by default) through util-linux: ``unshare --pid --fork --kill-child --net --mount-proc`` (a new
  PID namespace, so that the whole tree dies with its first process; a network namespace with only a down loopback;
  its own ``/proc``), then ``setpriv --reuid --regid --clear-groups --pdeathsig KILL`` (the user, and death with
  the launcher). Before that, in the child, a private mount namespace binds the call's directory over ``/tmp``,
  ``/var/tmp`` and ``/dev/shm``, so the world-writable places of the host are not reachable; elsewhere the user's
  file permissions apply (``nobody`` owns nothing).
- **an ordinary user**: the code runs as the job's user. With unprivileged user namespaces (``unshare --user``)
  it still gets the PID and network namespaces; without them there is no network isolation (the result says
  so: ``network_isolated`` false) and the process group is what is killed. It can write wherever the job's user
  can (``RLIMIT_FSIZE`` bounds each file): documented in docs/tools.md.

No module here imports torch or anything outside the standard library, so that an unprivileged test can import it
with the system Python.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import pwd
import resource
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["SandboxLimits", "SandboxResult", "Isolation", "isolation", "run_sandboxed"]

_CLONE_NEWNS = 0x00020000
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_PR_SET_PDEATHSIG = 1
#: World-writable places of the host hidden behind the call's own directory (root mode).
_HIDDEN_DIRS = ("/var/tmp", "/dev/shm", "/tmp")  # /tmp last: the call's directory may be under it


@dataclass(frozen=True)
class SandboxLimits:
    """The limits of one call. Sizes in bytes, times in seconds."""

    wall_s: float = 10.0
    cpu_s: int = 5
    memory_bytes: int = 512 * 2**20
    max_processes: int = 16  # processes the call may add to those its user already runs (the launcher's included)
    max_output_bytes: int = 64 * 2**10
    max_file_bytes: int = 16 * 2**20
    max_open_files: int = 64
    user: str = "nobody"  # the unprivileged user when the caller is root


@dataclass(frozen=True)
class SandboxResult:
    """What a call did. ``status``: ok, error (non-zero exit), timeout (wall clock), cpu_limit, memory,
    output_limit, killed (another signal) or failed_to_start."""

    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    network_isolated: bool
    user: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class Isolation:
    """How calls are isolated on this machine for this caller (decided once per process)."""

    as_root: bool
    user_namespaces: bool  # the non-root path: `unshare --user` works
    unshare: str | None
    setpriv: str | None
    notes: tuple[str, ...] = field(default=())

    @property
    def network_isolated(self) -> bool:
        return self.unshare is not None and (self.as_root or self.user_namespaces)


@functools.lru_cache(maxsize=1)
def isolation() -> Isolation:
    """Probe once what this process can do: root (drop to a user, namespaces) or not (user namespaces?)."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    as_root = os.geteuid() == 0
    notes: list[str] = []
    userns = False
    if as_root:
        if unshare is None or setpriv is None:
            notes.append("util-linux unshare/setpriv not found: running as root cannot drop to an unprivileged user")
    elif unshare is not None:
        probe = subprocess.run([unshare, "--user", "--map-current-user", "--net", "--pid", "--fork", "true"],
                               capture_output=True, timeout=10, check=False)
        userns = probe.returncode == 0
        if not userns:
            notes.append("no unprivileged user namespaces: no network isolation, the code runs as the job's user")
    return Isolation(as_root=as_root, user_namespaces=userns, unshare=unshare, setpriv=setpriv, notes=tuple(notes))


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def processes_of(uid: int) -> int:
    """How many processes the user ``uid`` runs now (``RLIMIT_NPROC`` counts them all, on the whole node)."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status", "rb") as fh:
                    for line in fh:
                        if line.startswith(b"Uid:"):
                            count += int(line.split()[1]) == uid
                            break
            except (OSError, ValueError, IndexError):
                continue
    return count


def _set_limits(limits: SandboxLimits, nproc: int) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _child_setup(limits: SandboxLimits, workdir: str, hide_dirs: bool, nproc: int) -> None:
    """Runs in the forked child before exec (the caller is single-threaded where it runs code: the tool worker)."""
    if hide_dirs:
        libc = _libc()
        _check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
        for target in _HIDDEN_DIRS:
            if os.path.isdir(target):
                _check(libc.mount(workdir.encode(), target.encode(), None, _MS_BIND, None), f"bind {target}")
        os.chdir("/tmp")  # the same directory, by the only path the code can see
    _set_limits(limits, nproc)
    # The launcher dies with its caller (the tool worker); the PID namespace then takes the whole tree with it.
    _check(_libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


#: The code must not be the PID namespace's first process (its init ignores signals it has no handler for, so a
#: crash would read as success): a shell is, and the whole namespace dies when it exits.
_INIT = ("/bin/sh", "-c", '"$@"; exit $?', "sandbox-init")


def _wrapped(argv: Sequence[str], iso: Isolation, uid: int | None, gid: int | None) -> list[str]:
    argv = [*_INIT, *argv]
    if iso.as_root and iso.unshare and iso.setpriv and uid is not None:
        return [iso.unshare, "--pid", "--fork", "--kill-child", "--net", "--mount-proc",
                iso.setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--pdeathsig=KILL", *argv]
    if not iso.as_root and iso.user_namespaces and iso.unshare:
        return [iso.unshare, "--user", "--map-current-user", "--pid", "--fork", "--kill-child", "--net",
                "--mount-proc", *argv]
    return list(argv[len(_INIT):])


def _collect(proc: subprocess.Popen[bytes], deadline: float, cap: int) -> tuple[bytes, bytes, str]:
    """Read stdout and stderr until both close, the deadline passes (``timeout``) or ``cap`` bytes came in all
    (``output_limit``); returns what was read, each cut at ``cap``."""
    out, err = bytearray(), bytearray()
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    reason = ""
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            reason = "timeout"
            break
        for key, _ in sel.select(timeout=min(left, 0.5)):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            key.data.extend(chunk)
            if len(out) + len(err) > cap:
                reason = "output_limit"
                break
        if reason:
            break
    sel.close()
    return bytes(out[:cap]), bytes(err[:cap]), reason


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _session_members(sid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != b"Z":
                pids.append(int(name))
    return pids


def _wait_gone(sid: int, deadline: float) -> None:
    """Return once no live process of the call's session is left (the PID namespace is torn down asynchronously),
    killing stragglers; bounded by ``deadline``."""
    while (left := _session_members(sid)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def _status(code: int, reason: str, stderr: str) -> str:
    if reason:
        return reason
    if code == 0:
        return "ok"
    if code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return "cpu_limit"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return "memory"
    if code < 0 or code > 128:
        return "killed"
    return "error"


def _remove(workdir: str) -> None:
    def fix(func: object, path: str, _exc: object) -> None:
        try:
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
        except OSError:
            pass
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass

    shutil.rmtree(workdir, onerror=fix)


def run_sandboxed(argv: Sequence[str], limits: SandboxLimits, *, files: dict[str, str] | None = None,
                  stdin: str = "", base_dir: str | None = None) -> SandboxResult:
    """Run ``argv`` (relative paths resolve in the call's own directory, where ``files`` are written first) under
    ``limits``; never raises for anything the code does, and returns within about ``limits.wall_s`` + 1 s."""
    iso = isolation()
    uid = gid = None
    user = pwd.getpwuid(os.geteuid()).pw_name
    if iso.as_root and not (iso.unshare and iso.setpriv):
        return SandboxResult("failed_to_start", None, "", "", 0.0, False, user, "the job runs as root and util-linux "
                             "unshare/setpriv are missing: untrusted code is not run as root")
    if iso.as_root:
        try:
            entry = pwd.getpwnam(limits.user)
        except KeyError:
            return SandboxResult("failed_to_start", None, "", "", 0.0, False, limits.user,
                                 f"sandbox user {limits.user!r} does not exist")
        uid, gid, user = entry.pw_uid, entry.pw_gid, limits.user
    workdir = tempfile.mkdtemp(prefix="hpcppo-sandbox-", dir=base_dir)
    try:
        for name, text in (files or {}).items():
            with open(os.path.join(workdir, name), "w", encoding="utf-8") as fh:
                fh.write(text)
        if uid is not None:
            for root, dirs, names in os.walk(workdir):
                for entry_name in [*dirs, *names, ""]:
                    os.chown(os.path.join(root, entry_name) if entry_name else root, uid, gid or 0)
        hide = uid is not None  # a private mount namespace needs root (CAP_SYS_ADMIN)
        home = "/tmp" if hide else workdir
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"}
        return _run(_wrapped(argv, iso, uid, gid), limits, workdir, env, stdin, hide,
                    iso.network_isolated and (uid is not None or not iso.as_root), user,
                    os.getuid() if uid is None else uid)
    finally:
        _remove(workdir)


def _run(argv: list[str], limits: SandboxLimits, workdir: str, env: dict[str, str], stdin: str, hide: bool,
         net_isolated: bool, user: str, uid: int) -> SandboxResult:
    start = time.monotonic()
    nproc = processes_of(uid) + limits.max_processes
    # stdin from a file: a pipe the code does not read would block the caller once its buffer is full
    with tempfile.TemporaryFile() as stdin_file:
        stdin_file.write(stdin.encode())
        stdin_file.seek(0)
        try:
            proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=stdin_file, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                                    preexec_fn=functools.partial(_child_setup, limits, workdir, hide, nproc))
        except (OSError, subprocess.SubprocessError) as exc:
            return SandboxResult("failed_to_start", None, "", "", 0.0, net_isolated, user,
                                 f"{type(exc).__name__}: {exc}")
    out, err, reason = _collect(proc, start + limits.wall_s, limits.max_output_bytes)
    if reason:
        _kill_group(proc)
    try:
        code = proc.wait(timeout=max(0.1, start + limits.wall_s - time.monotonic()))
    except subprocess.TimeoutExpired:
        reason = reason or "timeout"
        _kill_group(proc)
        code = proc.wait()
    _kill_group(proc)  # anything the code left behind in its group (outside a PID namespace)
    _wait_gone(proc.pid, time.monotonic() + 2.0)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    stderr = err.decode("utf-8", "replace")
    status = _status(code, reason, stderr)
    detail = {"timeout": f"wall-clock limit of {limits.wall_s:g} s", "output_limit":
              f"output over {limits.max_output_bytes} bytes", "cpu_limit": f"CPU limit of {limits.cpu_s} s",
              "memory": f"memory limit of {limits.memory_bytes // 2**20} MiB"}.get(status, "")
    if status in ("killed", "error") and not detail:
        signum = -code if code < 0 else code - 128 if code > 128 else 0
        detail = f"killed by signal {signum}" if signum else f"exit status {code}"
    return SandboxResult(status, code, out.decode("utf-8", "replace"), stderr, time.monotonic() - start,
                         net_isolated, user, detail)
