"""Commands that need torch: export (a checkpoint's actor as a Hugging Face directory) and tools make-model. The
dispatcher imports this module only for them, so the other commands stay torch-free on login nodes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hpcppo.cli.common import runs_root
from hpcppo.rundir import RunDir
from hpcppo.tiny import build_tiny_model_and_data
from hpcppo.train.export import export_actor


def cmd_export(args: argparse.Namespace) -> int:
    run = RunDir.open(runs_root(args), args.run)
    info = export_actor(run.path, Path(args.out), step=args.step)
    print(f"exported step {info['step']} of {info['run']} to {info['out']}")
    return 0


def cmd_make_model(args: argparse.Namespace) -> int:
    # The library validates every value (ConfigError, exit 2) and refuses a foreign --out (PathError).
    overrides = {} if args.max_operand is None else {"max_operand": args.max_operand}
    info = build_tiny_model_and_data(Path(args.out), Path(args.data_out) if args.data_out else None, seed=args.seed,
                                     train_size=args.train_size, val_size=args.val_size, force=args.force, **overrides)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    ws = info["warm_start"]
    print(f"tiny model {args.out}: {info['architecture']}, {info['num_parameters']:,} parameters, "
          f"{'built in ' + format(info['build_seconds'], '.0f') + ' s' if info.get('built') else 'up to date'}")
    print(f"  warm start on held-out prompts: greedy {ws['greedy_accuracy']:.3f}, sampled {ws['sampled_accuracy']:.3f}")
    for split, path in sorted(info.get("data", {}).items()):
        print(f"  {split}: {path}")
    return 0
