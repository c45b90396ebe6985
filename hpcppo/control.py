"""The run's control inbox: requests from the login node (``hpcppo rollback``) to the trainer.

Layout under ``runs/<id>/control/``::

    requests/<name>.json   waiting; <name> = <UTC yyyymmddTHHMMSS.ffffff>-<pid>-<4 hex>, so a plain sort is
                           the arrival order
    done/<name>.json       acknowledged: the request, the trainer's ``outcome`` and the ``acked`` time
    rejected/<name>        a file in the inbox that is not a valid request, moved aside unchanged, and
                           rejected/<name>.reason saying why

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

__all__ = ["ACTIONS", "DEFAULT_LR_SCALE", "Request", "RequestError", "acknowledge", "done", "pending",
           "submit_request", "validate_params", "wait_for_ack", "withdraw"]

log = logging.getLogger(__name__)

#: Actions the trainer understands, and the parameters each takes.
ACTIONS: dict[str, tuple[str, ...]] = {"rollback": ("to_step", "lr_scale")}
#: lr_scale of a rollback request that gives none: the default rule's (``kl_rollback``).
DEFAULT_LR_SCALE = 0.5

REQUESTS, DONE, REJECTED = "requests", "done", "rejected"
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


def _control(run_dir: Any) -> Path:
    """``<run_dir>/control``; ``run_dir`` is a path or a :class:`hpcppo.launch.rundir.RunDir`."""
    return Path(getattr(run_dir, "path", run_dir)) / "control"


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
    inbox = _control(root) / REQUESTS
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


def _reject(path: Path, reason: str) -> None:
    """Move a bad file to ``rejected/`` unchanged and write why beside it; never raises."""
    rejected = path.parent.parent / REJECTED  # control/requests/<name> -> control/rejected
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
    inbox = _control(run_dir) / REQUESTS
    try:
        entries = sorted(inbox.iterdir(), key=lambda p: p.name)
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
            _reject(path, str(exc) or type(exc).__name__)
    return out


def done(run_dir: Any, request_id: str) -> dict[str, Any] | None:
    """The acknowledgement of a request (its content, ``outcome`` and ``acked``), or None if not yet."""
    path = _control(run_dir) / DONE / f"{request_id}.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def acknowledge(run_dir: Any, request: Request, outcome: dict[str, Any]) -> None:
    """Record ``outcome`` in ``control/done/<name>`` atomically, then remove the request.

    Idempotent: a second call (say after a crash between the two steps) keeps the first outcome and
    only removes the request if it is still there.
    """
    target = _control(run_dir) / DONE / request.name
    if not target.exists():
        acked = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")
        atomic_write_json(target, {**request.to_dict(), "outcome": dict(outcome), "acked": acked})
    inbox = _control(run_dir) / REQUESTS
    with contextlib.suppress(FileNotFoundError):
        (inbox / request.name).unlink()
        fsync_dir(inbox)


def withdraw(run_dir: Any, request: Request) -> bool:
    """Remove a request nobody has acknowledged yet (its submission failed); True when it was removed."""
    inbox = _control(run_dir) / REQUESTS
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
