"""``hpcppo`` command line: parse, call the library, print, map error classes to exit codes.

Commands that do not train (compile, submit --dry-run, status, cancel, rollback, watchdog replay, config) never
import torch: they are meant for login nodes. Each command is a function of one module of this package
(:mod:`~hpcppo.cli.submit`, :mod:`~hpcppo.cli.control`, :mod:`~hpcppo.cli.seeing`, :mod:`~hpcppo.cli.configure`,
:mod:`~hpcppo.cli.export`, the one with torch, and :mod:`~hpcppo.cli.tools`); the parser (:mod:`hpcppo.cli.parser`) names it, and
:func:`dispatch` imports that module when the command runs, so a command loads its own libraries only. The library
raises :class:`hpcppo.errors.HpcppoError` subclasses; :func:`main` prints one line for them and returns the class's
exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import warnings
from typing import Any

from hpcppo.cli.common import err
from hpcppo.cli.parser import build_parser
from hpcppo.verl.names import VerlNameWarning
from hpcppo.errors import HpcppoError, PathError, SettingWarning

__all__ = ["main", "build_parser", "dispatch"]

_default_showwarning = warnings.showwarning
METRICS_READER_LOG = "hpcppo.metrics.reader"  # its logger, named here so that the CLI need not import h5py


def dispatch(handler: str, args: argparse.Namespace) -> int:
    """Run the command function ``handler`` (``"<module>:<function>"`` of this package) on ``args``."""
    module, name = handler.split(":")
    return int(getattr(importlib.import_module(f"{__name__}.{module}"), name)(args) or 0)


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    """verl key names accepted under their hpcppo names, settings that do nothing where they are: one line on
    stderr, like the errors."""
    if issubclass(category, (VerlNameWarning, SettingWarning)):
        print(f"hpcppo: warning: {message}", file=sys.stderr)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


class _DamageLines(logging.Handler):
    """The metric reader's line about a damaged file, as an error line, whichever command read the file (summary,
    export, plot, runs, follow, watchdog replay ...): it says what was lost, and the exit code says it too."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "damaged metric log" not in message:
            print(message, file=sys.stderr)
        elif message not in self.seen:  # a follow that reads the file again says it once
            self.seen.add(message)
            err(message)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.showwarning = _show_warning
    damage, reader_log = _DamageLines(), logging.getLogger(METRICS_READER_LOG)
    reader_log.addHandler(damage)
    try:
        rc = dispatch(args.func, args)
        return PathError.exit_code if damage.seen and rc == 0 else rc
    except HpcppoError as exc:
        err(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        err("interrupted")
        return 130
    finally:
        reader_log.removeHandler(damage)
