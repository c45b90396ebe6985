"""The job entry point: ``python -m hpcppo.train.main RUN_DIR`` (one process per rank).

The run directory's ``resolved.toml`` is the only input. The job kind (``train`` or ``preflight``)
is recorded there by the compiler. The process group is always destroyed, and the exit code tells
the batch script what to do next (see :mod:`hpcppo.exitcodes`).
"""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path

from hpcppo import exitcodes


def _setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s [rank {rank}] %(name)s: %(message)s",
        stream=sys.stdout,
        force=True,
    )


def run(run_dir: Path) -> int:
    from hpcppo.config import load_resolved
    from hpcppo.dist.env import detect_env
    from hpcppo.dist import env as dist_env

    compiled = load_resolved(run_dir / "resolved.toml")
    plan = compiled.plan
    env = detect_env(device_type=plan.device)
    _setup_logging(env.rank)
    dist_env.init_distributed(env, timeout_s=compiled.job.collective_timeout_s)
    try:
        if compiled.job.kind == "preflight":
            from hpcppo.train.preflight import run_preflight

            return run_preflight(env, run_dir, plan.world_size, compiled.job.preflight_paths)
        from hpcppo.train.trainer import run_training

        return run_training(compiled, env, run_dir)
    finally:
        dist_env.destroy_distributed()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m hpcppo.train.main RUN_DIR", file=sys.stderr)
        return exitcodes.FAILED
    try:
        return run(Path(argv[0]).resolve())
    except KeyboardInterrupt:
        return exitcodes.FAILED
    except Exception:  # the job log must keep the whole story
        traceback.print_exc()
        sys.stdout.flush()
        return exitcodes.FAILED


if __name__ == "__main__":
    sys.exit(main())
