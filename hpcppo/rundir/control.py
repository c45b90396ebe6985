"""The run's control inbox: requests from the login node (``hpcppo rollback``) to the trainer, and the pause files.

Layout under ``runs/<id>/control/`` (the names are :mod:`hpcppo.rundir.paths`')::

    requests/<name>.json   waiting; <name> = <UTC yyyymmddTHHMMSS.ffffff>-<pid>-<4 hex>, so a plain sort is
                           the arrival order
    done/<name>.json       acknowledged: the request, the trainer's ``outcome`` and the ``acked`` time
    rejected/<name>        a file in the inbox that is not a valid request, moved aside unchanged, and
                           rejected/<name>.reason saying why
    PAUSE                  a request to pause at the next step boundary; its text is the reason
                           (:func:`request_pause`; the trainer removes it when it pauses)
    PAUSED                 written by rank 0 when the run stopped on request: ``step <N>: <reason>``
                           (``hpcppo status`` shows it; ``hpcppo resume`` removes both files)

A request file is written to a temporary file in ``requests/`` (dot name, ignored by readers), fsynced and
renamed: the trainer never reads half a request, and two CLI calls at once make two distinct files.

The trainer, on global rank 0, calls :func:`pending` before the first step and at every step boundary,
applies what it finds and calls :func:`acknowledge`. :func:`pending` never raises for a bad file: the
trainer must not crash because someone dropped a broken file into its inbox.

No torch, no config import: the login-node CLI and the trainer both import this module.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import getpass
import json
import logging
import os
import re
import secrets
import socket
import time
from pathlib import Path
from typing import Any

import attrs

from hpcppo.errors import HpcppoError
from hpcppo.fsutil import atomic_write_json, atomic_write_text, fsync_dir
from hpcppo.rundir.paths import RunPaths

__all__ = ["ACTIONS", "DEFAULT_LR_SCALE", "Request", "RequestError", "acknowledge", "clear_pause", "done",
           "is_paused", "pause_reason_requested", "pause_requested", "pause_served", "paused_reason", "pending",
           "record_paused", "request_pause", "submit_request", "validate_params", "wait_for_ack", "withdraw"]

log = logging.getLogger(__name__)

#: Actions the trainer understands, and the parameters each takes.
ACTIONS: dict[str, tuple[str, ...]] = {"rollback": ("to_step", "lr_scale")}
#: lr_scale of a rollback request that gives none: the default rule's (``kl_rollback``).
DEFAULT_LR_SCALE = 0.5

_NAME_RE = re.compile(r"^(?P<stem>\d{8}T\d{6}\.\d{6}-\d+-[0-9a-f]{4})\.json$")
_KEYS = ("id", "action", "to_step", "lr_scale", "created", "requested_by")


class RequestError(HpcppoError, ValueError):
    """A control request names an unknown action or has a parameter out of range."""

    exit_code = 2


@attrs.frozen(kw_only=True)
class Request:
    """One request in the inbox. ``path`` is where it was read from (or written to)."""

    id: str  # the file stem: <UTC yyyymmddTHHMMSS.ffffff>-<pid>-<4 hex>
    action: str
    to_step: int | None  # rollback: newest committed checkpoint at or before it; None = the newest
    lr_scale: float | None  # rollback: lr multiplied by it; None = DEFAULT_LR_SCALE
    created: str  # ISO-8601 UTC
    path: Path
    requested_by: str = ""  # "<user>@<host> pid N"

    @property
    def name(self) -> str:
        return f"{self.id}.json"

    def to_dict(self) -> dict[str, Any]:
        """The file's content (everything but ``path``)."""
        return {"id": self.id, "action": self.action, "to_step": self.to_step, "lr_scale": self.lr_scale,
                "created": self.created, "requested_by": self.requested_by}


def _paths(run_dir: Any) -> RunPaths:
    """The paths of ``run_dir``, a path or a :class:`hpcppo.rundir.RunDir`."""
    return RunPaths(getattr(run_dir, "path", run_dir))


def validate_params(action: str, **params: Any) -> dict[str, Any]:
    """The request's parameters, every known one present (None = its default); RequestError otherwise."""
    if action not in ACTIONS:
        raise RequestError(f"unknown control action {action!r}; known actions: {', '.join(ACTIONS)}")
    known = ACTIONS[action]
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise RequestError(f"unknown parameter(s) {', '.join(unknown)} for {action!r}; it takes {', '.join(known)}")
    to_step = params.get("to_step")
    if to_step is not None and (isinstance(to_step, bool) or not isinstance(to_step, int) or to_step < 0):
        raise RequestError(f"to_step must be an integer >= 0, got {to_step!r}")
    lr_scale = params.get("lr_scale")
    if lr_scale is not None:
        if isinstance(lr_scale, bool) or not isinstance(lr_scale, (int, float)) or not 0.0 < lr_scale <= 1.0:
            raise RequestError(f"lr_scale must be a number in (0, 1] (the learning rates are multiplied by it), "
                               f"got {lr_scale!r}")
        lr_scale = float(lr_scale)
    return {"to_step": to_step, "lr_scale": lr_scale}


def _requester() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no USER/LOGNAME and no passwd entry (some containers)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


def submit_request(run_dir: Any, action: str, **params: Any) -> Request:
    """Validate and write a request into ``control/requests/`` atomically; returns it.

    Raises RequestError for an unknown action or a bad parameter, FileNotFoundError when ``run_dir`` is
    not a directory (the inbox is never created outside a run). Nothing is written on error.
    """
    values = validate_params(action, **params)
    root = Path(getattr(run_dir, "path", run_dir))
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such run directory")
    now = _dt.datetime.now(_dt.timezone.utc)
    stem = f"{now:%Y%m%dT%H%M%S.%f}-{os.getpid()}-{secrets.token_hex(2)}"
    inbox = _paths(root).requests
    request = Request(id=stem, action=action, created=now.isoformat(timespec="microseconds"),
                      path=inbox / f"{stem}.json", requested_by=_requester(), **values)
    atomic_write_json(request.path, request.to_dict())
    return request


def _parse(path: Path) -> Request:
    """A request from its file; ValueError naming what is wrong."""
    m = _NAME_RE.match(path.name)
    if not m:
        raise ValueError("the file name is not <UTC yyyymmddTHHMMSS.ffffff>-<pid>-<4 hex>.json")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; a request has {', '.join(_KEYS)}")
    missing = [k for k in ("id", "action", "created") if k not in data]
    if missing:
        raise ValueError(f"missing key(s) {', '.join(missing)}")
    if data["id"] != m.group("stem"):
        raise ValueError(f"id {data['id']!r} does not match the file name")
    if not isinstance(data["created"], str) or not isinstance(data.get("requested_by", ""), str):
        raise ValueError("created and requested_by must be strings")
    action = data["action"]
    params = {k: data.get(k) for k in ACTIONS.get(action, ())} if isinstance(action, str) else {}
    try:
        values = validate_params(action, **params)
    except RequestError as exc:
        raise ValueError(exc.message) from None
    return Request(id=data["id"], action=action, created=data["created"], path=path,
                   requested_by=data.get("requested_by", ""), **values)


def _reject(path: Path, rejected: Path, reason: str) -> None:
    """Move a bad file to ``rejected`` (the run's ``control/rejected/``) unchanged and write why beside it; never
    raises."""
    try:
        rejected.mkdir(parents=True, exist_ok=True)
        os.replace(path, rejected / path.name)
        fsync_dir(path.parent)
    except OSError as exc:
        log.warning("control: cannot move the invalid request %s to %s (%s); reason: %s", path, rejected, exc, reason)
        return
    with contextlib.suppress(OSError):
        atomic_write_text(rejected / f"{path.name}.reason", reason + "\n")
    log.warning("control: rejected %s: %s", path.name, reason)


def pending(run_dir: Any) -> list[Request]:
    """The valid requests waiting in the inbox, in arrival order (by name).

    Temporary files (dot names) and directories are skipped; any other file that is not a valid request
    is moved to ``control/rejected/`` with a ``.reason`` file. Never raises on a bad or vanishing file.
    """
    paths = _paths(run_dir)
    try:
        entries = sorted(paths.requests.iterdir(), key=lambda p: p.name)
    except OSError:  # no inbox yet (nothing was ever requested), or unreadable
        return []
    out = []
    for path in entries:
        if path.name.startswith(".") or not path.is_file():
            continue
        try:
            out.append(_parse(path))
        except FileNotFoundError:
            continue  # withdrawn or acknowledged meanwhile
        except (OSError, ValueError) as exc:
            _reject(path, paths.rejected, str(exc) or type(exc).__name__)
    return out


def done(run_dir: Any, request_id: str) -> dict[str, Any] | None:
    """The acknowledgement of a request (its content, ``outcome`` and ``acked``), or None if not yet."""
    path = _paths(run_dir).done / f"{request_id}.json"
    try:
        ack: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return ack


def acknowledge(run_dir: Any, request: Request, outcome: dict[str, Any]) -> None:
    """Record ``outcome`` in ``control/done/<name>`` atomically, then remove the request.

    Idempotent: a second call (say after a crash between the two steps) keeps the first outcome and
    only removes the request if it is still there.
    """
    target = _paths(run_dir).done / request.name
    if not target.exists():
        acked = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")
        atomic_write_json(target, {**request.to_dict(), "outcome": dict(outcome), "acked": acked})
    inbox = _paths(run_dir).requests
    with contextlib.suppress(FileNotFoundError):
        (inbox / request.name).unlink()
        fsync_dir(inbox)


def withdraw(run_dir: Any, request: Request) -> bool:
    """Remove a request nobody has acknowledged yet (its submission failed); True when it was removed."""
    inbox = _paths(run_dir).requests
    try:
        (inbox / request.name).unlink()
    except FileNotFoundError:
        return False
    fsync_dir(inbox)
    return True


def wait_for_ack(run_dir: Any, request: Request, *, timeout_s: float, poll_s: float = 1.0) -> dict[str, Any] | None:
    """Poll ``control/done/`` for the acknowledgement of ``request``; None after ``timeout_s``."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    while True:
        ack = done(run_dir, request.id)
        if ack is not None or time.monotonic() >= deadline:
            return ack
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())) or 0.01)


# ----------------------------------------------------------------------------- pause
def request_pause(run_dir: Any, reason: str) -> Path:
    """Ask the trainer to pause at its next step boundary; ``reason`` becomes the reason ``hpcppo status`` shows."""
    return atomic_write_text(_paths(run_dir).pause_request, reason.strip() + "\n")


def pause_requested(run_dir: Any) -> bool:
    return _paths(run_dir).pause_request.exists()


def pause_reason_requested(run_dir: Any) -> str:
    """The text of the pause request ("" when there is none or it cannot be read)."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return _paths(run_dir).pause_request.read_text().strip()
    return ""


def pause_served(run_dir: Any) -> None:
    """Rank 0, once it paused on the request: remove it (it would pause the next attempt again)."""
    _paths(run_dir).pause_request.unlink(missing_ok=True)


def record_paused(run_dir: Any, step: int, reason: str) -> None:
    """Rank 0, on pausing (on request or by a watchdog rule): say why, as ``step <N>: <reason>``."""
    atomic_write_text(_paths(run_dir).paused, f"step {step}: {reason}\n")


def paused_reason(run_dir: Any) -> str | None:
    """Why the run stopped on request, or None when it did not (or the file is empty or unreadable)."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return _paths(run_dir).paused.read_text().strip() or None
    return None


def is_paused(run_dir: Any) -> bool:
    return _paths(run_dir).paused.exists()


def clear_pause(run_dir: Any) -> None:
    """Remove the pause request and the paused record (``hpcppo resume``, before it submits)."""
    paths = _paths(run_dir)
    for path in (paths.pause_request, paths.paused):
        path.unlink(missing_ok=True)
