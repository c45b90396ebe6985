"""``python -m hpcppo.watchdog RUN_DIR [--attempt ID] [--interval S] [--max-restarts N]``: the process beside
the trainer (:mod:`hpcppo.watchdog.monitor`). Started by the batch script (Slurm) or by rank 0's local script;
no torch import. Exit status 0 when it stopped as designed (the job ended, or it acted), 1 when an action
failed, 2 on a usage or configuration error."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import attrs

from hpcppo.errors import HpcppoError
from hpcppo.rundir import RunPaths
from hpcppo.watchdog import monitor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcppo.watchdog", description="The process beside the trainer: "
                                     "hangs and dead trainers, from the metric log (hpcppo.watchdog.monitor).")
    parser.add_argument("run_dir", type=Path, help="The run directory (its resolved.toml is read).")
    parser.add_argument("--attempt", default=os.environ.get("HPCPPO_ATTEMPT", "unknown"),
                        help="The job's attempt id, as in HPCPPO_ATTEMPT (default: that variable): names the exit "
                             "record control/exit-code.<ID> and finds this attempt's trainer processes.")
    parser.add_argument("--interval", type=float, default=None, metavar="S",
                        help="Seconds between two looks (default: watchdog.interval_s).")
    parser.add_argument("--max-restarts", type=int, default=None, metavar="N",
                        help="Hang recoveries per run before the job is stopped instead (default: 3).")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, force=True,
                        format="%(asctime)s [watchdog monitor] %(message)s")
    if args.interval is not None and not args.interval > 0:
        parser.error("--interval must be positive")
    run_dir = args.run_dir.resolve()
    try:
        settings, enabled = monitor.settings_from_run(run_dir, interval_s=args.interval)
    except (HpcppoError, OSError) as exc:
        print(f"watchdog monitor: {exc}", file=sys.stderr)
        return 2
    if not enabled:
        logging.info("watchdog.enable is false in %s; nothing to do", RunPaths(run_dir).resolved)
        return 0
    if args.max_restarts is not None:
        settings = attrs.evolve(settings, max_restarts=args.max_restarts)
    return monitor.Monitor(run_dir, args.attempt, settings).run()


if __name__ == "__main__":
    sys.exit(main())
