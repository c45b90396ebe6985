"""What the command modules share: the one error line and the runs root of a command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpcppo import config

DEFAULT_SITE = "local"
# The rule itself is hpcppo.config.runs_root.
RUNS_ROOT_HELP = "directory of run directories (default: $HPCPPO_RUNS_ROOT, else the site's paths.runs_root)"


def err(msg: str) -> None:
    # One line, whatever the message quotes (a value with a newline must not start a second line).
    one_line = msg.replace("\r", "\\r").replace("\n", "\\n")
    print(f"hpcppo: error: {one_line}", file=sys.stderr)


def runs_root(args: argparse.Namespace) -> Path:
    return config.runs_root(config.load_site(args.site), args.runs_root)
