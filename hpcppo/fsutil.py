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


def require_parent_dir(out: str | os.PathLike[str]) -> None:
    """PathError unless the user's output file ``out`` has an existing parent directory.

    :func:`atomic_write` creates missing directories, which is right for paths hpcppo owns (a run directory)
    but not for a path the user typed (``-o /nonexistent/dir/m.csv`` made directories under ``/``): a typo
    there is reported, not built.
    """
    parent = Path(out).parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist (create it first, or write elsewhere)"
        raise PathError(f"{out} cannot be written: {parent} {why}")


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
