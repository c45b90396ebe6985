"""Typed errors a user can cause, each with its own exit code.

The library raises these; ``hpcppo.cli`` maps each class to one clear line on stderr and its exit
code in one place. Anything else escaping to the CLI is an internal bug and keeps its traceback.
"""

from __future__ import annotations


class HpcppoError(Exception):
    """Base class of every user-facing error."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class ConfigError(HpcppoError):
    """A TOML file or an override is malformed, has an unknown key, a wrong type or a bad value.

    The message names the file, the dotted key and what is allowed.
    """

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None, hint: str | None = None):
        prefix = ""
        if file:
            prefix += f"{file}: "
        if key:
            prefix += f"{key}: "
        super().__init__(prefix + message, hint=hint)
        self.file = file
        self.key = key


class SiteNotFoundError(ConfigError):
    """``--site NAME`` names no site profile."""

    exit_code = 3


class ResolveError(HpcppoError):
    """The experiment does not fit the site: batch arithmetic or resources do not add up."""

    exit_code = 4


class PathError(HpcppoError):
    """A model, data or run path the experiment needs does not exist or is not usable."""

    exit_code = 5


class RunIdError(HpcppoError):
    """A run id is malformed (path traversal, bad characters) or names no run."""

    exit_code = 6


class SchedulerError(HpcppoError):
    """The scheduler is missing (``sbatch`` not on PATH) or rejected/failed a request (its stderr is shown)."""

    exit_code = 7


class RunStateError(HpcppoError):
    """The run is not in a state that allows the request (e.g. rollback without a checkpoint)."""

    exit_code = 8


class RunBusyError(RunStateError):
    """Another command is changing the run right now (it holds the run directory's lock): try again later."""

    exit_code = 9


class WeightSyncError(HpcppoError):
    """The rollout engine's log-probs of a step's samples are not the trainer's after a weight sync: the job stops
    (exit 1, the line in its exit record); raised in the job, never by a command."""


class ToolFailureError(HpcppoError):
    """A tool failed (raised, crashed its worker, timed out) more often in one step than
    ``rollout.multi_turn.max_tool_failures_per_step``: the job stops (exit 1, the line naming the tool in its exit
    record); raised in the job, never by a command."""


class StorageError(HpcppoError):
    """A file system the run writes to refused a write: full, over quota, read-only, or gone."""

    exit_code = 10


class RunRecordError(RunStateError, ValueError):
    """A run's ``run.json`` cannot be read or is not a run record (a ``ValueError`` too, as the JSON error was)."""


class SettingWarning(UserWarning):
    """A setting the user wrote that does nothing in its combination (or is overruled by a documented precedence):
    the CLI shows it as one ``hpcppo: warning:`` line on stderr and goes on."""
