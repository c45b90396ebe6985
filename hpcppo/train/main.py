"""The job entry point: ``python -m hpcppo.train.main RUN_DIR`` (one process per rank).

The run directory's ``resolved.toml`` is the only input. The job kind (``train`` or ``preflight``)
is recorded there by the compiler. The process group is always destroyed, and the exit code tells
the batch script what to do next (see :mod:`hpcppo.rundir.exitcodes`).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, cast

from hpcppo import jobenv
from hpcppo.errors import HpcppoError
from hpcppo.placement import placement_of, task_env
from hpcppo.rundir import RunPaths, exitcodes
from hpcppo.train.signals import PreemptionFlag  # signal and threading only: nothing slow before the handler

if TYPE_CHECKING:
    from hpcppo.config import Compiled
    from hpcppo.distributed.env import DeviceType


def _setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s [rank {rank}] %(name)s: %(message)s",
        stream=sys.stdout,
        force=True,
    )


def run(run_dir: Path) -> int:
    # First, before anything slow: a USR2/TERM that arrives while the models load must be kept, not kill the rank.
    preempt = PreemptionFlag()
    from hpcppo.config import load_resolved
    from hpcppo.distributed import env as dist_env
    from hpcppo.distributed.env import detect_env

    compiled = load_resolved(RunPaths(run_dir).resolved)
    # The job script exports these; a job started another way (torchrun, a container run with --cleanenv) gets
    # them here, before anything touches CUDA: cuBLAS reads CUBLAS_WORKSPACE_CONFIG at its first matmul.
    jobenv.apply_job_defaults(os.environ, deterministic=compiled.experiment.trainer.deterministic)
    # Split placement: this task's role (a trainer's RANK/WORLD_SIZE become the trainers' world), before detect_env.
    os.environ.update(task_env(placement_of(compiled), os.environ))
    plan = compiled.plan
    if os.environ.get("HPCPPO_ROLE") == "rollout":  # a rollout rank: not in the trainers' world (hpcppo.placement)
        _setup_logging(int(os.environ.get("HPCPPO_GLOBAL_RANK", "0")))
        if compiled.job.kind != "train":
            return exitcodes.DONE  # preflight checks the trainers' world; a rollout rank has nothing to add
        from hpcppo.train.rollout_rank import run_rollout_rank

        try:
            return run_rollout_rank(compiled, run_dir, device_type=plan.device, preempt=preempt)
        finally:
            preempt.restore()
    env = detect_env(device_type=cast("DeviceType", plan.device))  # "cpu" or "cuda": RunPlan.device's values
    _setup_logging(env.rank)
    dist_env.init_distributed(env, timeout_s=compiled.job.collective_timeout_s)
    finished = False
    try:
        record_and_check_versions(compiled, env.rank, run_dir)
        if compiled.job.kind == "preflight":
            from hpcppo.train.preflight import run_preflight

            code = run_preflight(env, run_dir, plan.train_dp_size, list(compiled.job.preflight_paths))
        else:
            from hpcppo.train.trainer import run_training

            code = run_training(compiled, env, run_dir, preempt=preempt)
        if env.rank == 0:
            record_exit_code(run_dir, code)
        finished = True
        return code
    except HpcppoError as exc:
        # Diagnosed (a full disk during a checkpoint, a damaged checkpoint ...): the explanation goes into the exit
        # record, where `hpcppo status` shows it, not only into the rank log.
        if env.rank == 0:
            try:
                record_exit_code(run_dir, exitcodes.FAILED, str(exc))
            except OSError as write_error:  # the disk may be what failed: the log line still says it
                print(f"hpcppo: could not write the exit record: {write_error}", file=sys.stderr, flush=True)
        raise
    finally:
        preempt.restore()
        # Ranks that finished together leave together; after an error nobody waits for peers that may be gone.
        dist_env.destroy_distributed(sync_timeout_s=min(120.0, compiled.job.collective_timeout_s) if finished else None)


def record_and_check_versions(compiled: Compiled, rank: int, run_dir: Path) -> None:
    """Rank 0 records the attempt's library versions (``versions.json``); with the vLLM engine every rank stops on
    a vLLM other than the tested minor (:func:`hpcppo.train.versions.check_vllm`), before anything is built."""
    from hpcppo.train import versions

    found = versions.runtime_versions()
    if rank == 0:
        versions.record_versions(run_dir, os.environ.get("HPCPPO_ATTEMPT", "unknown"), found)
    rollout = compiled.experiment.rollout
    if compiled.job.kind == "train" and rollout.engine == "vllm":
        versions.check_vllm(found["vllm"], allow_untested=rollout.allow_untested_vllm)


def record_exit_code(run_dir: Path, code: int, reason: str | None = None) -> None:
    """Rank 0's verdict for the batch script: ``srun`` reports the highest task exit code, and a task killed
    by ``--kill-on-bad-exit`` (137) would mask the requeue/pause code, so the script reads this file. ``reason``:
    the one line that explains a diagnosed failure, for ``hpcppo status``."""
    exitcodes.write_exit_record(run_dir, os.environ.get("HPCPPO_ATTEMPT", "unknown"), code, reason)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m hpcppo.train.main RUN_DIR", file=sys.stderr)
        return exitcodes.FAILED
    try:
        return run(Path(argv[0]).resolve())
    except KeyboardInterrupt:
        return exitcodes.FAILED
    except HpcppoError as e:  # diagnosed (a full disk, a damaged checkpoint …): one line says what and what next
        print(f"hpcppo: error: {e}", file=sys.stderr, flush=True)
        return exitcodes.FAILED
    except Exception:  # the job log must keep the whole story
        traceback.print_exc()
        sys.stdout.flush()
        return exitcodes.FAILED


def _exit(code: int) -> None:
    """Leave without the interpreter's teardown. Everything the job owns is closed and flushed by now; what is
    left are the native thread pools of gloo, Arrow and tokenizers, whose static destructors can abort the process
    (``terminate called without an active exception``) and turn a clean exit code into SIGABRT."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
