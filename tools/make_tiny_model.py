#!/usr/bin/env python3
"""Build the offline tiny model (and optionally the arithmetic task's Parquet data).

    .venv/bin/python tools/make_tiny_model.py --out runs/_models/arith-tiny \\
        --data-out runs/_data/arith --train-size 4096 --val-size 512

Idempotent: returns at once when the outputs already hold a build with the same settings.
Prints the build summary (hpcppo_tiny.json plus "built" and the data paths) as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hpcppo.errors import HpcppoError  # noqa: E402
from hpcppo.tiny import build_tiny_model_and_data  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="model directory to create (Hugging Face layout)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-out", type=Path, default=None, help="also write train.parquet and val.parquet here")
    ap.add_argument("--train-size", type=int, default=4096)
    ap.add_argument("--val-size", type=int, default=512)
    ap.add_argument("--max-operand", type=int, default=None, help="task difficulty (default: the library's)")
    ap.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = ap.parse_args(argv)
    if args.train_size < 1 or args.val_size < 1:
        ap.error("--train-size and --val-size must be >= 1")
    overrides = {} if args.max_operand is None else {"max_operand": args.max_operand}
    try:
        info = build_tiny_model_and_data(
            args.out,
            args.data_out,
            seed=args.seed,
            train_size=args.train_size,
            val_size=args.val_size,
            force=args.force,
            **overrides,
        )
    except HpcppoError as exc:  # a bad setting, or --out naming a directory that is not a build
        print(f"make_tiny_model: {exc}", file=sys.stderr)
        return exc.exit_code
    summary = {k: v for k, v in info.items() if k != "warm_start"}
    summary["warm_start"] = {k: v for k, v in info["warm_start"].items() if k != "history"}
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
