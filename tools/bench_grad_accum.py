"""Issue 31, item 1: what gradient accumulation keeps, per rank, on a ~100M-parameter actor over 2 gloo ranks.

    .venv/bin/python tools/bench_grad_accum.py                  # ~100M model, 8 rows per rank: 1 vs 8 micro-batches
    .venv/bin/python tools/bench_grad_accum.py --layers 4 --json out.json

One optimizer step of the actor exactly as the trainer runs it (``train.update.run_update`` with ``actor_loss``,
FSDP2 with the trainer's defaults for an fp32 model, AdamW), with the mini-batch in one micro-batch and in
``--micro-batches`` of them. Per rank and run:
  grad bytes   the most gradient storage held between micro-batches and at the optimizer step
               (``distributed.fsdp.held_gradient_bytes``: FSDP's internal unsharded gradients included), as a ratio
               to the rank's gradient shard (the bound the trainer keeps: 1.0);
  peak RSS     the process's peak resident set above its resident set before the update (Linux ``VmHWM``, reset
               through ``/proc/self/clear_refs``), as a ratio to the shard: over the forwards and backwards of the
               accumulation (read just before the optimizer step), and over the whole update (which adds AdamW's
               two moments, created at the first step, and the step's temporaries). Each run is a fresh pair of
               processes, so no run reuses another's heap.
For reference, each run is repeated with FSDP2's ``set_requires_gradient_sync(False)`` between micro-batches (the
"no-sync" accumulation the trainer used before; FSDP1's ``no_sync``): it holds every parameter's unsharded gradient.
All ratios are measured in this one invocation, on the same model and batch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from _bench_train_workload import free_port  # noqa: E402
from bench_scale import _actor_batch  # noqa: E402


def _peak_rss_reset() -> int:
    """Reset the peak resident set (Linux: ``clear_refs`` 5) and return the current one, in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS")


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str, mode: str, micro: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hpcppo.config.experiment import ActorSection
    from hpcppo.distributed import env as dist_env
    from hpcppo.distributed.fsdp import apply_fsdp, held_gradient_bytes, largest_unit_bytes
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.train import batching
    from hpcppo.train.optim import LRSchedule, build_optimizer
    from hpcppo.train.update import UpdateSettings, actor_loss, run_update

    dist_env.init_distributed(dist_env.detect_env(device_type="cpu"), timeout_s=1200)
    cfg = Qwen2Config(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                      num_key_value_heads=max(1, args.hidden // 256), intermediate_size=args.hidden * 8 // 3,
                      vocab_size=args.vocab, tie_word_embeddings=False, max_position_embeddings=4096)
    mesh = build_mesh("cpu", world, 1, hsdp=False)
    batch = _actor_batch(args, rank)

    def no_sync(model, last: bool) -> None:  # the reference: FSDP1-style accumulation without communication
        model.set_requires_gradient_sync(last)

    if mode == "no-sync":
        batching.set_last_micro_batch = no_sync
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    apply_fsdp(model, mesh, param_dtype=None, reduce_dtype=torch.float32, cpu_offload=False,
               reshard_after_forward=True)
    shard = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    actor = ActorSection(ppo_micro_batch_size_per_gpu=micro)
    opt = build_optimizer(model, lr=1e-6, weight_decay=actor.weight_decay, betas=actor.betas)
    lr = LRSchedule(opt, base_lr=1e-6, warmup_steps=0, total_steps=100, schedule="constant", min_lr_ratio=0.0)
    settings = UpdateSettings(prefix="actor", epochs=1, mini_batch_per_rank=args.samples, micro_batch_per_rank=micro,
                              grad_clip=actor.grad_clip, world_size=world, max_response_length=args.response)
    inner = actor_loss(model, actor, clip_ratio_low=0.2, clip_ratio_high=0.2, kl_loss=False, temperature=1.0)
    held: list[int] = []

    def loss(mb, info, sums, n_micro):
        held.append(held_gradient_bytes(model))
        return inner(mb, info, sums, n_micro)

    real_step = opt.step

    accumulation_peak: list[int] = []

    def step(*a, **k):
        held.append(held_gradient_bytes(model))
        accumulation_peak.append(_status_bytes("VmHWM"))  # before AdamW creates its moments
        return real_step(*a, **k)

    opt.step = step  # type: ignore[method-assign]
    before = _peak_rss_reset()
    run_update(batch, model, opt, lr, settings, loss)
    peak = _status_bytes("VmHWM") - before
    result = {"mode": mode, "micro_batches": args.samples // micro, "shard_bytes": shard,
              "unit_bytes": largest_unit_bytes(model), "grad_bytes": max(held), "peak_rss_bytes": peak,
              "accumulation_rss_bytes": accumulation_peak[0] - before,
              "params": sum(p.numel() for p in model.parameters())}
    (Path(out) / f"rank-{rank}.json").write_text(json.dumps(result))
    dist_env.destroy_distributed(sync_timeout_s=600)


def report(runs: list[list[dict]]) -> list[dict]:
    """Print one line per run (its ranks' min-max) and return the rows."""
    rows = []
    print(f"{'accumulation':<12} {'micro-batches':>13} {'grad bytes / shard':>19} {'RSS rise / shard: backwards':>28}"
          f" {'whole update':>13}   (per rank: min-max over ranks)")
    for per_rank in runs:
        first = per_rank[0]
        grad = [r["grad_bytes"] / r["shard_bytes"] for r in per_rank]
        rss = [r["peak_rss_bytes"] / r["shard_bytes"] for r in per_rank]
        acc = [r["accumulation_rss_bytes"] / r["shard_bytes"] for r in per_rank]
        print(f"{first['mode']:<12} {first['micro_batches']:>13} {min(grad):>9.2f}-{max(grad):<9.2f}"
              f" {min(acc):>17.2f}-{max(acc):<10.2f} {min(rss):>6.2f}-{max(rss):<6.2f}")
        rows.append({"mode": first["mode"], "micro_batches": first["micro_batches"], "grad_over_shard": grad,
                     "accumulation_rss_rise_over_shard": acc, "peak_rss_rise_over_shard": rss})
    first = runs[0][0]
    print(f"model: {first['params'] / 1e6:.1f}M parameters; gradient shard per rank {first['shard_bytes'] / 2**20:.0f} MiB "
          f"(fp32), largest FSDP unit {first['unit_bytes'] / 2**20:.0f} MiB unsharded")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--samples", type=int, default=8, help="rows of the mini-batch per rank (one optimizer step)")
    ap.add_argument("--micro-batches", type=int, default=8, help="micro-batches of the accumulating run")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--response", type=int, default=64)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.samples % args.micro_batches:
        ap.error(f"--samples {args.samples} is not a multiple of --micro-batches {args.micro_batches}")
    runs = []
    for mode in ("sharded", "no-sync"):
        for micro in (args.samples, args.samples // args.micro_batches):
            with tempfile.TemporaryDirectory(prefix="bench-grad-accum-") as out:
                mp.start_processes(_worker, args=(args.world, free_port(), args, out, mode, micro), nprocs=args.world,
                                   join=True, start_method="spawn")
                runs.append([json.loads((Path(out) / f"rank-{r}.json").read_text()) for r in range(args.world)])
    rows = report(runs)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
