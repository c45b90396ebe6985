#!/usr/bin/env python3
"""Convert GSM8K JSONL (github.com/openai/grade-school-math layout) into verl's Parquet prompt files.

    python tools/prepare_gsm8k.py --input ../shared/data/gsm8k --out data/gsm8k [--split train|test]

writes ``<out>/train.parquet`` and/or ``<out>/test.parquet`` with the rows verl's own preprocessing produces, so a
config can point ``data.train_files`` at them. Exit codes are those of ``hpcppo.errors`` (2 bad input, 5 bad path).
"""

from __future__ import annotations

import argparse
import sys

from hpcppo.data.gsm8k import SPLITS, convert_gsm8k
from hpcppo.errors import HpcppoError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="a directory with train.jsonl/test.jsonl, or one .jsonl file")
    parser.add_argument("--out", required=True, help="output directory for <split>.parquet")
    parser.add_argument("--split", choices=SPLITS, default=None,
                        help="convert only this split (for a file: its split, default from the file name)")
    args = parser.parse_args(argv)
    try:
        written = convert_gsm8k(args.input, args.out, split=args.split)
    except HpcppoError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    for split, (path, rows) in written.items():
        print(f"{split}: {rows} rows -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
