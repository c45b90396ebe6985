"""On-disk layout of checkpoints: ``runs/<id>/checkpoints/step-<N>/`` plus the ``COMMITTED`` marker.

No torch import: the login-node CLI (``hpcppo status``, ``hpcppo rollback``) lists checkpoints with this module.

A checkpoint directory is usable only when it is named exactly ``step-<N>`` and holds ``COMMITTED``. Everything
else under the checkpoints root is either in flight or debris of a crash:

- ``step-<N>.tmp-<hex>/`` — being written (or a writer died);
- ``step-<N>.old-<hex>/`` — a committed checkpoint of the same step set aside while it is being replaced;
- ``step-<N>/`` without ``COMMITTED`` — renamed into place but the writer died before marking it;
- ``step-<N>.abandoned-<hex>/`` — a committed checkpoint from a branch a rollback abandoned (see ``abandon_after``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from hpcppo.fsutil import atomic_write_bytes, fsync_dir  # noqa: F401  (fsync_dir: part of this API)

MARKER = "COMMITTED"
_STEP_RE = re.compile(r"^step-(\d+)$")
_AUX_RE = re.compile(r"^step-(\d+)\.(tmp|old)-[0-9a-f]+$")
_ABANDONED_RE = re.compile(r"^step-(\d+)\.abandoned-[0-9a-f]+$")


def checkpoints_root(run_dir: str | os.PathLike[str]) -> Path:
    """``<run_dir>/checkpoints``."""
    return Path(run_dir) / "checkpoints"


def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    """``<root>/step-<step>`` (``root`` is the checkpoints directory)."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return Path(root) / f"step-{step}"


def checkpoint_dir_for(run_dir: str | os.PathLike[str], step: int) -> Path:
    """``<run_dir>/checkpoints/step-<step>``."""
    return step_dir(checkpoints_root(run_dir), step)


def parse_step(name: str) -> int | None:
    """The step of a final checkpoint directory name, else None. ``parse_step("step-40") == 40``."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def is_committed(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / MARKER).is_file()


def list_committed(root: str | os.PathLike[str]) -> list[int]:
    """Steps of the committed checkpoints under ``root``, ascending; ``[]`` when ``root`` does not exist."""
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for entry in root.iterdir():
        step = parse_step(entry.name)
        if step is not None and entry.is_dir() and is_committed(entry):
            steps.append(step)
    return sorted(steps)


def latest_committed(root: str | os.PathLike[str]) -> int | None:
    """The highest committed step under ``root``, or None."""
    steps = list_committed(root)
    return steps[-1] if steps else None


def stale_dirs(root: str | os.PathLike[str]) -> list[Path]:
    """Crash debris under ``root``: tmp/old directories and final-named directories without the marker."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for entry in sorted(root.iterdir()):
        if not entry.is_dir():
            continue
        if _AUX_RE.match(entry.name) or (parse_step(entry.name) is not None and not is_committed(entry)):
            out.append(entry)
    return out


def abandoned_dirs(root: str | os.PathLike[str]) -> list[Path]:
    """Checkpoints set aside by ``abandon_after``."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(e for e in root.iterdir() if e.is_dir() and _ABANDONED_RE.match(e.name))


def abandon_after(root: str | os.PathLike[str], step: int) -> list[int]:
    """Set aside every committed checkpoint newer than ``step``; return their steps.

    After a rollback to ``step`` the run re-reaches later steps on a new branch; the old branch's checkpoints must
    not be mistaken for the latest (a requeue would resume from them). They are renamed, not deleted, so they stay
    available for a post-mortem until retention removes them. Call with no save in flight (one process).
    """
    root = Path(root)
    moved = [s for s in list_committed(root) if s > step]
    for s in moved:
        os.rename(step_dir(root, s), root / f"step-{s}.abandoned-{os.urandom(4).hex()}")
    if moved:
        fsync_dir(root)
    return moved


def write_file_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader or a crash sees the old file or the whole new one."""
    atomic_write_bytes(path, data)


def write_marker(checkpoint_dir: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Mark ``checkpoint_dir`` committed, atomically, with ``payload`` (JSON) describing it."""
    write_file_atomic(Path(checkpoint_dir) / MARKER, (json.dumps(payload, sort_keys=True) + "\n").encode())


def read_marker(checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON payload of a committed checkpoint's marker."""
    return json.loads((Path(checkpoint_dir) / MARKER).read_text())
