"""Issue 35: split placement against colocated on the same cores, both in this one invocation, interleaved.

    .venv/bin/python tools/bench_placement.py                      # arith + longer generation, 2 rounds, 8 steps
    .venv/bin/python tools/bench_placement.py --rounds 3 --steps 12 --json out.json

The arith example's model and data (``hpcppo.tiny``: the warm-started tiny Llama, built once into ``--cache``) on 2
CPU processes, through the real job entry point (``python -m hpcppo.train.main``, one process per rank, gloo):

  colocated   2 ranks, each generating and training its half of the batch (examples/arith-tiny.toml);
  split       1 trainer rank + 1 rollout rank, rollout.max_staleness = 1 (examples/arith-tiny-async.toml): the
              rollout rank generates step t+1 while the trainer trains step t;
  split-2     the same split with max_staleness = 2: step t+2 from step t's weights (a deeper pipeline; with the
              fixed lag the trainer's broadcast waits for the unit before, so it overlaps no more than staleness 1);
  no-overlap  the same split with max_staleness = 0: the trainer waits for each step's samples (what split costs
              without its overlap: a weight broadcast a step and one rank training the whole batch).

Each setting runs ``--steps`` steps, validation and checkpoints off, the order of the settings rotated every round so no
setting always runs on a warmer machine. Per setting: the median of ``perf/step_time_s`` over the steps after the
first (start-up excluded), ``time/trainer_idle_s`` and ``time/rollout_idle_s`` (split), and the reward curve
(``reward/mean`` per step, the mean over rounds). Two workloads: the arith example as it is (the warm model answers
in ~4 tokens), and a longer-generation one: an untrained tiny model of the same shape, which rarely samples EOS, so
every response runs to ``--long-response`` tokens (``--long-n`` samples per prompt), where generation is a real part
of the step and the overlap shows (its reward stays ~0: a timing workload, not a learning one).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {
    "colocated": ("arith-tiny.toml", 2, []),
    "split": ("arith-tiny-async.toml", 2, ["rollout.max_staleness=1"]),
    "split-2": ("arith-tiny-async.toml", 2, ["rollout.max_staleness=2"]),
    "no-overlap": ("arith-tiny-async.toml", 2, ["rollout.max_staleness=0"]),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _model(cache: Path) -> Path:
    if not (cache / "model" / "config.json").exists():
        from hpcppo.tiny import build_tiny_model_and_data

        build_tiny_model_and_data(cache / "model", cache / "data", seed=0)
    if not (cache / "random-model" / "config.json").exists():  # the longer-generation workload's model
        from hpcppo.tiny import TinySettings, build_model, build_tokenizer

        tok = build_tokenizer()
        build_model(tok, TinySettings(seed=3)).save_pretrained(cache / "random-model")
        tok.save_pretrained(cache / "random-model")
    return cache


def _run(example: str, world: int, overrides: list[str], root: Path, runs: Path) -> Path:
    from hpcppo.launch import jobs

    data = root / "data"
    over = [f"model.path={root / 'model'}", f"data.train_files=['{data / 'train.parquet'}']",
            f"data.val_files=['{data / 'val.parquet'}']", "trainer.test_freq=0", "trainer.val_before_train=false",
            "checkpoint.save_every=-1", f"site.local.procs_per_node={world}", *overrides]
    run = jobs.compile_run(REPO / "examples" / example, "local", over, runs_root=str(runs)).run.path
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), HPCPPO_ATTEMPT="a0")
        log = open(run / "logs" / f"rank-a0-{rank}.log", "wb")
        procs.append(subprocess.Popen([sys.executable, "-m", "hpcppo.train.main", str(run)], env=env, stdout=log,
                                      stderr=subprocess.STDOUT, cwd=REPO))
    codes = [p.wait(timeout=1800) for p in procs]
    if any(codes):
        raise SystemExit(f"{run}: exit codes {codes}; see {run / 'logs'}")
    return run


def _figures(run: Path) -> dict[str, Any]:
    from hpcppo import metrics as hmetrics

    df = hmetrics.load(run)
    later = df[df["step"] > 1]
    out: dict[str, Any] = {"step_time_s": float(statistics.median(later["perf/step_time_s"])),
                              "reward": [float(x) for x in df["reward/mean"]]}
    for key in ("time/generate_s", "time/trainer_idle_s", "time/rollout_idle_s", "time/weight_sync_s",
                "time/actor_update_s"):
        if key in df and df[key].notna().any():
            out[key] = float(statistics.median(later[key].dropna()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--long-response", type=int, default=48, help="response tokens of the longer-generation workload")
    ap.add_argument("--long-n", type=int, default=4, help="samples per prompt of the longer-generation workload")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "hpcppo-bench-placement")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    root = _model(args.cache)
    # The warm model answers in ~4 tokens and stops; an untrained one of the same shape rarely samples EOS, so every
    # response runs to max_response_length: generation then takes about as long as training (its reward is ~0).
    workloads = {"arith": [], "long": [f"model.path={root / 'random-model'}", "data.max_prompt_length=16",
                                       f"data.max_response_length={args.long_response}", f"rollout.n={args.long_n}"]}
    results: dict[str, dict[str, list[dict[str, Any]]]] = {w: {s: [] for s in SETTINGS} for w in workloads}
    names = list(SETTINGS)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for workload, extra in workloads.items():
                for setting in order:
                    example, world, over = SETTINGS[setting]
                    start = time.perf_counter()
                    run = _run(example, world, [f"trainer.total_steps={args.steps}", *over, *extra], root, Path(tmp))
                    fig = _figures(run)
                    results[workload][setting].append(fig)
                    print(f"round {r + 1} {workload:5s} {setting:10s} step {fig['step_time_s']:.3f} s "
                          f"(run {time.perf_counter() - start:.0f} s)", flush=True)
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for workload, by_setting in results.items():
        print(f"\n{workload}: median step time over rounds (s), and the reward curve (mean over rounds)")
        summary[workload] = {}
        for setting, figs in by_setting.items():
            row: dict[str, Any] = {"step_time_s": statistics.median(float(f["step_time_s"]) for f in figs)}
            for key in ("time/generate_s", "time/trainer_idle_s", "time/rollout_idle_s", "time/weight_sync_s",
                        "time/actor_update_s"):
                vals = [float(f[key]) for f in figs if key in f]
                if vals:
                    row[key] = statistics.median(vals)
            curves = [f["reward"] for f in figs]
            row["reward"] = [statistics.mean(c[i] for c in curves) for i in range(min(len(c) for c in curves))]
            summary[workload][setting] = row
            extras = "  ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in row.items() if k.startswith("time/"))
            reward = " ".join(f"{x:.2f}" for x in row["reward"])
            print(f"  {setting:10s} {row['step_time_s']:.3f} s/step  {extras}\n  {'':10s} reward {reward}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary,
                                         "rounds": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
