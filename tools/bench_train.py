"""Where the PPO trainer's time goes: per-phase times and the I/O and FLOP ratios of its real Trainer, one process.

    .venv/bin/python tools/bench_train.py                 # 1 warm-up + 10 measured steps, ~1 min on 2 cores
    .venv/bin/python tools/bench_train.py --steps 4 --threads 1 --profile

The real :class:`hpcppo.train.trainer.Trainer` (world size 1, gloo, FSDP2 on one rank, HF rollout engine) on a
~0.5M-parameter Qwen2-architecture model built here (random weights, no warm start), 64 prompts x 16 new tokens,
1 PPO epoch of 4 mini-batches, GAE with a separate critic, a reference (KL in the reward), a checkpoint every step.
It reports the trainer's own ``time/*`` phases (medians over the measured steps), and, measured in the same process
after training: the float32 ``torch.mm`` peak (the update's FLOP/s against it), a tensor copy of the weight-sync
bytes, a write + fsync of a file of the checkpoint's size, and one actor mini-batch update split into forward,
backward, clip and optimizer step, for the FSDP2-wrapped actor and for a plain Hugging Face copy of it.

How hpcppo compares with other implementations is ``tools/bench_peers.py``'s job (TRL and a cleanrl-style loop
doing the same passes, interleaved, on the workload issue 11 fixed); the ratios at a size where bandwidth matters
are ``tools/bench_scale.py``'s. ``--profile`` prints where the trainer's time goes (cProfile over its measured
steps; it slows the Python-heavy parts, so read the phase times from a run without it).

The pieces live next to this script: ``_bench_train_workload.py`` (shape, model, prompts, spec),
``_bench_train_measure.py`` (micro-benchmarks) and ``_bench_train_report.py`` (figures and printing).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The helper modules live next to this script; its directory is on sys.path when it runs as a script, and
# this makes them importable when it is loaded some other way (runpy, importlib).
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _bench_train_measure import (  # noqa: E402
    copy_rate,
    dir_bytes,
    file_write_rate,
    matmul_peak,
    n_params,
    update_breakdown,
)
from _bench_train_report import figures, print_phases, print_profile, print_ratios  # noqa: E402
from _bench_train_workload import MINI_BATCHES, build_model_and_data, free_port, write_spec  # noqa: E402
from torch.distributed.fsdp import FSDPModule  # noqa: E402


# ---------------------------------------------------------------------------------------------- the trainer, timed
def make_bench_trainer(*, profile: bool, warmup: int):
    """A :class:`Trainer` that records each step's batch shape and, with ``profile``, cProfiles its measured steps."""
    from hpcppo.train.trainer import Trainer

    class BenchTrainer(Trainer):
        shapes: list[tuple[int, int, int]] = []
        profiler = cProfile.Profile() if profile else None

        def train(self) -> int:
            if self.profiler is not None and warmup == 0:
                self.profiler.enable()
            return super().train()

        def rollout(self):
            batch = super().rollout()
            # (samples, prompt+response width, response width): the FLOP count and the widths reported
            self.shapes.append((*batch["input_ids"].shape, batch["responses"].shape[1]))
            return batch

        def log_metrics(self, step: int, metrics: dict[str, float], note: str = "") -> None:
            super().log_metrics(step, metrics, note)
            if self.profiler is not None and not note and step == warmup:
                self.profiler.enable()  # from the first measured step on

    return BenchTrainer


def plain_actor(paths: dict[str, Path], actor: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The same actor as a plain Hugging Face model (no FSDP) with the trainer's AdamW settings."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(paths["model"]), dtype=torch.float32).train()
    return model, torch.optim.AdamW(model.parameters(), lr=actor.lr, weight_decay=actor.weight_decay, betas=actor.betas)


# ---------------------------------------------------------------------------------------------- main
def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Build, train, measure the reference rates; returns the figures."""
    from hpcppo.compiler import compile_config
    from hpcppo.distributed import env as dist_env
    from hpcppo.metrics import load as load_metrics
    from hpcppo.rundir import RunPaths
    from hpcppo.train.build import build_components

    paths = build_model_and_data(root, train_rows=512)
    compiled = compile_config(write_spec(root, paths, steps=args.warmup + args.steps), "local", check_paths=False)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    env = dist_env.detect_env(device_type="cpu")
    if env.world_size != 1:
        raise SystemExit(f"run this benchmark as a single process (found world size {env.world_size})")
    dist_env.init_distributed(env, timeout_s=120)
    try:
        run_dir = root / "run"
        RunPaths(run_dir).control.mkdir(parents=True, exist_ok=True)
        comps = build_components(compiled, env, run_dir)
        torch.set_num_threads(args.threads)
        trainer = make_bench_trainer(profile=args.profile, warmup=args.warmup)(comps)
        try:
            code = trainer.train()
        finally:
            trainer.close()
        if code != 0:
            raise SystemExit(f"the trainer returned exit code {code}")
        df = load_metrics(run_dir)
        sync_bytes = sum(p.numel() * p.element_size() for p in comps.actor.model.parameters())
        ckpt_bytes = dir_bytes(comps.ckpt.step_dir(comps.ckpt.latest_committed()))
        samples, width, _ = trainer.shapes[-1]
        breakdown = update_breakdown({"hpcppo actor (as built)": (comps.actor.model, comps.actor.optim),
                                      "plain HF actor": plain_actor(paths, compiled.experiment.actor)},
                                     samples // MINI_BATCHES, width, len(comps.tokenizer))
        results = figures(args.warmup, trainer, df[df["step"] > args.warmup],
                          actor_n=n_params(comps.actor.model), critic_n=n_params(comps.critic and comps.critic.model),
                          sync_bytes=sync_bytes,
                          ckpt_bytes=ckpt_bytes, peak=matmul_peak(), copy_bps=copy_rate(sync_bytes),
                          write_bps=file_write_rate(run_dir, ckpt_bytes), breakdown=breakdown,
                          fsdp=isinstance(comps.actor.model, FSDPModule))
    finally:
        dist_env.destroy_distributed()
    print_phases(results, args.steps, args.warmup)
    print_ratios(results)
    if trainer.profiler is not None:
        print_profile(trainer.profiler)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="measured steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=1, help="steps left out of the medians")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="torch threads for everything (default: all cores, as a 1-rank trainer uses)")
    ap.add_argument("--profile", action="store_true", help="cProfile the trainer's measured steps")
    ap.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    ap.add_argument("--keep", type=Path, help="work in this directory and keep it (default: a temporary one)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("--steps and --threads must be >= 1, --warmup >= 0")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the trainer's thread policy yields to it
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    t0 = time.perf_counter()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        results = run(args, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
            results = run(args, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"total benchmark wall time: {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
