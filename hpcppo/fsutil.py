"""Crash-safe file writes, shared by every module that writes something a reader or a crash can observe.

``atomic_write`` writes into a temporary file in the target's directory, fsyncs it, renames it over the
target and fsyncs the directory: a reader sees the old file or the whole new one, never a torn one.
No torch import (the login-node CLI uses this).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from hpcppo.errors import PathError


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (creations, renames) durable. Filesystems that cannot fsync a
    directory (some network mounts answer EINVAL) are tolerated: the rename itself is still atomic."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# What a path may hold when the file system cannot say (POSIX's minimums for Linux's usual file systems).
NAME_MAX_FALLBACK, PATH_MAX_FALLBACK = 255, 4096


def _nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest ancestor that exists (the root, at worst); never raises."""
    for p in (path, *path.parents):
        try:
            if os.path.lexists(p):
                return p
        except OSError:
            continue
    return Path(path.anchor or ".")


def _limit(path: Path, name: str, fallback: int) -> int:
    try:
        return int(os.pathconf(path, name))
    except (OSError, ValueError):
        return fallback


def path_length_problem(path: str | os.PathLike[str]) -> str | None:
    """Why the file system cannot hold ``path`` (a component longer than its ``NAME_MAX``, the whole longer than
    ``PATH_MAX``), or None. Checked before any ``stat``: on such a path even ``exists()`` raises ``ENAMETOOLONG``."""
    text = os.fspath(path)
    where = _nearest_existing(Path(os.path.abspath(text)))
    name_max = _limit(where, "PC_NAME_MAX", NAME_MAX_FALLBACK)
    path_max = _limit(where, "PC_PATH_MAX", PATH_MAX_FALLBACK)
    for part in Path(text).parts:
        if len(os.fsencode(part)) > name_max:
            return f"a component of {len(os.fsencode(part))} bytes ({part[:20]}...) is longer than the file " \
                   f"system's limit of {name_max}"
    if len(os.fsencode(os.path.abspath(text))) >= path_max:
        return f"the path is {len(os.fsencode(os.path.abspath(text)))} bytes, the limit is {path_max - 1}"
    return None


def _probe_writable(directory: Path) -> str | None:
    """Why nothing can be created in ``directory`` (read-only mount, permissions, a pseudo file system such as
    /proc), or None. ``os.access`` cannot tell (root passes it on /proc): a directory is made and removed."""
    try:
        probe = tempfile.mkdtemp(prefix=".hpcppo-probe-", dir=directory)
    except OSError as exc:
        return f"cannot create anything in {directory} ({exc.strerror or exc})"
    with contextlib.suppress(OSError):
        os.rmdir(probe)
    return None


def _usable(path: str | os.PathLike[str], what: str, *, kind: str) -> None:
    text = os.fspath(path)
    if not text.strip():
        raise PathError(f"{what}: an empty path names no {kind}")
    if "\x00" in text:
        raise PathError(f"{what} {text!r}: a path cannot hold a NUL character")
    problem = path_length_problem(path)
    if problem:
        raise PathError(f"{what} {text[:60]}{'...' if len(text) > 60 else ''}: {problem}")


def require_parent_dir(out: str | os.PathLike[str], what: str = "") -> None:
    """PathError unless the user's output file ``out`` can be written: an existing parent directory that accepts
    new files, and ``out`` itself a regular file or absent (never a directory, a device, a FIFO).

    :func:`atomic_write` creates missing directories, which is right for paths hpcppo owns (a run directory)
    but not for a path the user typed (``-o /nonexistent/dir/m.csv`` made directories under ``/``): a typo
    there is reported, not built.
    """
    label = what or os.fspath(out)
    _usable(out, label, kind="file")
    out = Path(out)
    parent = out.parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist (create it first, or write elsewhere)"
        raise PathError(f"{out} cannot be written: {parent} {why}")
    if out.is_dir():
        raise PathError(f"{out}: is a directory; {what or 'the output'} names a file to write")
    if os.path.lexists(out) and not out.is_file():
        raise PathError(f"{out}: exists and is not a regular file (a device, a FIFO or a dangling link); "
                        "write elsewhere")
    problem = _probe_writable(parent)
    if problem:
        raise PathError(f"{out} cannot be written: {problem}")


def require_output_dir(path: str | os.PathLike[str], what: str) -> Path:
    """PathError unless ``path`` is, or can become, a directory that accepts files: not empty, within the file
    system's name limits, no file (or device) where it or an ancestor must be a directory, and the nearest existing
    ancestor writable. Nothing is created (a probe directory is made and removed). Returns ``path``."""
    _usable(path, what, kind="directory")
    path = Path(path)
    here = _nearest_existing(path)
    if not here.is_dir():
        thing = "a file" if here.is_file() else "not a directory (a device, a FIFO or a dangling link)"
        raise PathError(f"{what} {path}: {here} is {thing}; {what} must be a directory (new or existing)")
    problem = _probe_writable(here)
    if problem:
        raise PathError(f"{what} {path}: {problem}")
    return path


def require_distinct(paths: dict[str, str | os.PathLike[str] | None]) -> None:
    """PathError when two of the named outputs are the same directory or one lies inside another (a build that
    replaces one would delete the other)."""
    real = {what: Path(os.path.realpath(os.fspath(p))) for what, p in paths.items() if p}
    names = list(real)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pa, pb = real[a], real[b]
            if pa == pb:
                raise PathError(f"{a} and {b} are the same directory ({pa}); give each its own")
            if pa in pb.parents or pb in pa.parents:
                inner, outer = (a, b) if pb in pa.parents else (b, a)
                raise PathError(f"{inner} {real[inner]} lies inside {outer} {real[outer]}; give each its own "
                                "directory")


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], Any], *, mode: int = 0o644,
                 durable: bool = True) -> Path:
    """Call ``write(binary_file)`` on a temporary file, then fsync and rename it to ``path``. ``durable=False``
    skips both fsyncs, for a file rewritten every few seconds whose loss in a crash costs nothing (a heartbeat):
    readers still see the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)
    return path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> Path:
    return atomic_write(path, lambda f: f.write(data), mode=mode)


def atomic_write_text(path: str | os.PathLike[str], text: str, mode: int = 0o644) -> Path:
    return atomic_write_bytes(path, text.encode(), mode)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, durable: bool = True) -> Path:
    text = json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"
    return atomic_write(path, lambda f: f.write(text.encode()), durable=durable)
