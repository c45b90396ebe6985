"""``hpcppo export``: a checkpoint's actor as a Hugging Face directory. The one command that imports torch (through
:mod:`hpcppo.train.export`); the dispatcher imports this module only for it, so the others stay torch-free on login
nodes."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from hpcppo.cli.common import runs_root
from hpcppo.errors import PathError
from hpcppo.fsutil import require_output_dir
from hpcppo.rundir import RunDir
from hpcppo.train.export import export_actor


def cmd_export(args: argparse.Namespace) -> int:
    if os.path.lexists(args.out):
        raise PathError(f"--out {args.out} already exists; choose a new directory")
    require_output_dir(args.out, "--out")
    run = RunDir.open(runs_root(args), args.run)
    info = export_actor(run.path, Path(args.out), step=args.step)
    print(f"exported step {info['step']} of {info['run']} to {info['out']}"
          + (f" (LoRA merged; the adapters alone in {info['adapter']})" if "adapter" in info else ""))
    return 0
