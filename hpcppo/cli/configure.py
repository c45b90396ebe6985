"""Commands about configuration, no run directory involved: plan, config show/explain, import-verl."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hpcppo import compiler, config
from hpcppo.cli.common import err
from hpcppo.verl import importer
from hpcppo.config.compiled import check_engine_installed, check_trackers_installed
from hpcppo.config.convert import MAX_INPUT_BYTES
from hpcppo.errors import HpcppoError
from hpcppo.fsutil import require_parent_dir
from hpcppo.sizing import report
from hpcppo.sizing.estimate import estimate


def cmd_plan(args: argparse.Namespace) -> int:
    # Not refused here when it does not fit: the table shows what is over, compile refuses.
    compiled = compiler.compile_config(Path(args.spec), args.site, args.override, check_paths=False, check_memory=False)
    # What compile refuses about the job's interpreter, plan refuses too (paths may exist only on the cluster).
    check_engine_installed(compiled.site, compiled.experiment)
    check_trackers_installed(compiled.site, compiled.experiment)
    data = compiled.experiment.data
    val_prompts = None
    if data.val_files:  # the Parquet footers (no rows read); pyarrow for this command only
        from hpcppo.data.dataset import count_rows

        val_prompts = count_rows(data.val_files)
    budget = estimate(compiled.site, compiled.experiment, compiled.plan, val_prompts=val_prompts)
    if args.json:
        print(json.dumps(report.as_json(budget, site=compiled.site.name, spec=args.spec), indent=2, allow_nan=False))
    else:
        from rich.console import Console

        console = Console(width=max(120, Console().width))
        for part in report.render(budget, site=compiled.site.name, spec=args.spec):
            console.print(part)
    return 0


def cmd_import_verl(args: argparse.Namespace) -> int:
    if args.table:
        sys.stdout.write(importer.render_doc())
        return 0
    if args.input is None:
        raise HpcppoError("give a verl command line or YAML file (or - for stdin), or --table")
    require_parent_dir(args.out, "-o")
    # One character past the limit is enough for the library to refuse the input; an endless stdin does not hang.
    stdin_text = sys.stdin.read(MAX_INPUT_BYTES + 1) if args.input == "-" else None
    imp, problem = importer.import_verl(args.input, Path(args.out), force=args.force, name=args.name,
                                           stdin_text=stdin_text, watchdog=args.watchdog)
    for line in importer.format_report(imp):
        print(f"hpcppo: {line}", file=sys.stderr)
    print(f"wrote {args.out}: {len(imp.values)} keys from verl, {len(imp.report)} settings not translated "
          f"(listed above and at the end of the file)", file=sys.stderr)
    if problem:  # a cross-field check the single values could not see: written anyway, to be edited
        err(f"{args.out} does not load yet: {problem}")
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    compiled = compiler.compile_config(Path(args.spec), args.site, args.override, check_paths=False)
    if args.toml:
        sys.stdout.write(config.to_toml(compiled))
    else:
        sys.stdout.write(config.render_provenance(compiled))
    return 0


def cmd_config_explain(args: argparse.Namespace) -> int:
    print(config.explain(args.key))
    return 0
