"""Issue 11, item 3: a ~100M-parameter model on 1 and 2 ranks, each figure against its own bound in the same process.

    .venv/bin/python tools/bench_scale.py                       # 1 and 2 ranks, 3 measured rounds each (~minutes)
    .venv/bin/python tools/bench_scale.py --worlds 1 --rounds 2 --layers 4

Per rank, in rounds (every figure of a round measured side by side with its bound):
  update      one optimizer step of the actor as the trainer runs it (``hpcppo.train.update.run_update`` with
              ``actor_loss``, verl's clipped policy loss): a mini-batch of ``--samples`` rows per rank in
              micro-batches of ``--micro`` (gradients reduce-scattered on every one), grad clip, AdamW, on the
              FSDP2-wrapped model (``apply_fsdp`` with the trainer's defaults). Its model FLOPs (see ``model_flops``:
              the decoder's matmuls over every token, the LM head over the positions it scores, causal attention,
              backward = 2 x forward; the embedding lookup and element-wise work count nothing) against the float32
              ``torch.mm`` peak of this process on the same threads (bound: >= 50%);
  weight sync ``HFEngine.sync_weights(iter_full_params(actor, into=engine.sync_targets))`` (the trainer's path)
              against a tensor copy of the same bytes (bound: >= 1/3), and on 2+ ranks against moving the same bytes
              in one collective, the way ``iter_full_params`` gathers on this backend (one broadcast per rank on
              gloo): what the transport alone costs, with gloo over TCP loopback far more than a memcpy;
  checkpoint  ``CheckpointManager.save`` (synchronous) of model + AdamW state against a plain write + fsync of the
              same bytes per rank, all ranks at once (bound: >= 50%); ``load`` of it against one ``readinto`` of
              those bytes into a buffer allocated beforehand (both from the page cache: a resume right after a
              save; the bound is the same 50%).
Ranks are processes with gloo on CPU, sharing the machine's cores (threads per rank = cores / ranks). Once built,
each rank freezes its start-up heap out of the garbage collector, as a trainer rank does before its first step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from _bench_train_workload import free_port  # noqa: E402


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def model_flops(model, tokens: int, scored: int, seq_len: int) -> int:
    """Model FLOPs of one forward + backward over ``tokens`` tokens in sequences of ``seq_len``, ``scored`` of
    which go through the LM head (``logits_to_keep``): 2 per weight per token in every decoder ``Linear``, 2 per
    LM-head weight per scored position, causal attention's QK^T and AV (on average ``seq_len / 2`` keys per query),
    and backward = 2 x forward. The embedding lookup, norms, activations and softmax count nothing."""
    from torch import nn

    layers = model.model.layers
    body = sum(m.weight.numel() for layer in layers for m in layer.modules() if isinstance(m, nn.Linear))
    cfg = model.config
    attn = 2 * 2 * len(layers) * cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads) * (seq_len / 2)
    forward = 2 * body * tokens + 2 * model.lm_head.weight.numel() * scored + attn * tokens
    return int(3 * forward)


def _actor_batch(args: argparse.Namespace, rank: int) -> dict:
    """A rollout batch as the actor update receives it: prompt + response ids, old log-probs, advantages."""
    g = torch.Generator().manual_seed(1000 + rank)
    rows, width = args.samples, args.prompt + args.response
    ids = torch.randint(0, args.vocab, (rows, width), generator=g)
    mask = torch.ones(rows, args.response)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(width).expand(rows, width),
            "responses": ids[:, args.prompt:], "response_mask": mask,
            "old_log_probs": -torch.rand(rows, args.response, generator=g) * 4,
            "advantages": torch.randn(rows, args.response, generator=g)}


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    threads = max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    import torch.distributed as dist
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hpcppo.config.experiment import ActorSection
    from hpcppo.distributed import env as dist_env
    from hpcppo.distributed.checkpoint import CheckpointManager
    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.distributed.weights import _all_gather, iter_full_params
    from hpcppo.rollout.hf import HFRolloutEngine
    from hpcppo.train.build import freeze_long_lived_objects
    from hpcppo.train.optim import LRSchedule, build_optimizer
    from hpcppo.train.update import UpdateSettings, actor_loss, run_update

    dist_env.init_distributed(dist_env.detect_env(device_type="cpu"), timeout_s=1200)
    cfg = Qwen2Config(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                      num_key_value_heads=max(1, args.hidden // 256), intermediate_size=args.hidden * 8 // 3,
                      vocab_size=args.vocab, tie_word_embeddings=False, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    engine = HFRolloutEngine(Qwen2ForCausalLM(cfg))
    n = sum(p.numel() for p in model.parameters())
    seq = args.prompt + args.response
    flops = model_flops(model, args.samples * seq, args.samples * (args.response + 1), seq)
    # The trainer's FSDP defaults for an fp32 model ([actor.fsdp]: reshard_after_forward, reduce_dtype float32).
    apply_fsdp(model, build_mesh("cpu", world, 1, hsdp=False), param_dtype=None, reduce_dtype=torch.float32,
               cpu_offload=False, reshard_after_forward=True)
    actor = ActorSection(ppo_micro_batch_size_per_gpu=args.micro)
    opt = build_optimizer(model, lr=1e-6, weight_decay=actor.weight_decay, betas=actor.betas)
    lr = LRSchedule(opt, base_lr=1e-6, warmup_steps=0, total_steps=100, schedule="constant", min_lr_ratio=0.0)
    settings = UpdateSettings(prefix="actor", epochs=1, mini_batch_per_rank=args.samples, micro_batch_per_rank=args.micro,
                              grad_clip=actor.grad_clip, world_size=world, max_response_length=args.response)
    loss = actor_loss(model, actor, clip_ratio_low=0.2, clip_ratio_high=0.2, kl_loss=False, temperature=1.0)
    batch = _actor_batch(args, rank)
    a, b, c = (torch.randn(1024, 1024) for _ in range(3))
    root = Path(out) / "ckpt"
    mgr = CheckpointManager(root, keep_last=1)

    def update() -> None:
        run_update(batch, model, opt, lr, settings, loss)  # ends with the metrics' all-reduce: every rank is done

    def peak() -> float:
        torch.mm(a, b, out=c)
        return min(_time(lambda: torch.mm(a, b, out=c)) for _ in range(3))

    sync_bytes = n * 4
    src, dst = torch.ones(sync_bytes, dtype=torch.uint8), torch.empty(sync_bytes, dtype=torch.uint8)
    shard = torch.ones(sync_bytes // world, dtype=torch.uint8)

    def gather() -> None:
        if world > 1:
            _all_gather(dst, shard, dist.group.WORLD)

    rec: dict[str, list[float]] = {}
    update()  # warm-up, and creates the AdamW state the checkpoint holds
    freeze_long_lived_objects()  # what Trainer.train does before its loop
    step = 0
    for r in range(args.rounds + 1):
        step += 1
        m = {"update_s": _time(update), "mm_s": peak()}
        dist_env.barrier()  # every collective is timed from a common start, as the gather below is
        m["sync_s"] = _time(lambda: engine.sync_weights(iter_full_params(model, into=engine.sync_targets)))
        m["copy_s"] = _time(lambda: dst.copy_(src))
        dist_env.barrier()
        m["gather_s"] = _time(gather)
        dist_env.barrier()
        m["save_s"] = _time(lambda: mgr.save(step, models={"m": model}, optimizers={"m": opt}, extra={"step": step}))
        own = sum(p.stat().st_size for p in (mgr.step_dir(step)).rglob("*") if p.is_file()) // world
        m["load_s"] = _time(lambda: mgr.load(step, models={"m": model}, optimizers={"m": opt}))
        data = os.urandom(own)
        probe = Path(out) / f"probe-{rank}.bin"
        dist_env.barrier()

        def write() -> None:
            with open(probe, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())

        m["write_s"] = _time(write)
        back = bytearray(own)  # allocated and touched before the clock starts, as the load's target tensors are

        def read() -> None:
            with open(probe, "rb", buffering=0) as f:
                f.readinto(back)

        dist_env.barrier()
        m["read_s"] = _time(read)
        probe.unlink()
        m["own_bytes"] = own
        if r:
            for k, v in m.items():
                rec.setdefault(k, []).append(v)
    res = {"n": n, "threads": threads, "tokens": args.samples * seq, "flops": flops, "sync_bytes": sync_bytes,
           "shape": f"{args.samples} x ({args.prompt} + {args.response}) tokens in micro-batches of {args.micro}",
           "raw": rec}
    with open(Path(out) / f"rank-{rank}.json", "w") as f:
        json.dump(res, f)
    dist_env.destroy_distributed(sync_timeout_s=600)


def spread(v: list[float]) -> str:
    return f"{statistics.median(v):8.3f} [{min(v):.3f}-{max(v):.3f}]"


def report(world: int, ranks: list[dict]) -> dict:
    r0 = ranks[0]
    n, raw, flops = r0["n"], r0["raw"], r0["flops"]  # per rank: each rank updates on its own tokens
    fr = {
        "update_vs_peak": [(flops / u) / (2 * 1024**3 / p) for u, p in zip(raw["update_s"], raw["mm_s"])],
        "sync_vs_copy": [c / s for s, c in zip(raw["sync_s"], raw["copy_s"])],
        "sync_vs_gather": [g / s for s, g in zip(raw["sync_s"], raw["gather_s"])] if world > 1 else [],
        "save_vs_write": [w / s for s, w in zip(raw["save_s"], raw["write_s"])],
        "load_vs_read": [rd / ld for ld, rd in zip(raw["load_s"], raw["read_s"])],
    }
    print(f"\n== {world} rank(s): Qwen2 {n / 1e6:.1f}M params, fp32, FSDP2 over {world}, {r0['threads']} threads per "
          f"rank, {r0['shape']} per rank per update, rank 0's figures, median [min-max] over {len(raw['update_s'])} "
          f"rounds")
    print(f"  update (run_update, actor)   {spread(raw['update_s'])} s = "
          f"{flops / statistics.median(raw['update_s']) / 1e9:.1f} GFLOP/s; matmul peak "
          f"{2 * 1024**3 / statistics.median(raw['mm_s']) / 1e9:.1f} GFLOP/s")
    print(f"  weight sync ({r0['sync_bytes'] / 1e6:.0f} MB)          {spread(raw['sync_s'])} s; tensor copy "
          f"{spread(raw['copy_s'])} s" + (f"; one gather of the bytes {spread(raw['gather_s'])} s" if world > 1 else ""))
    mb = statistics.median(raw["own_bytes"]) / 1e6
    print(f"  checkpoint save              {spread(raw['save_s'])} s; write+fsync of this rank's {mb:.0f} MB "
          f"{spread(raw['write_s'])} s")
    print(f"  checkpoint load              {spread(raw['load_s'])} s; read of the same bytes {spread(raw['read_s'])} s")
    bounds = {"update_vs_peak": 0.5, "sync_vs_copy": 1 / 3, "save_vs_write": 0.5, "load_vs_read": 0.5}
    for k, v in fr.items():
        if k not in bounds:
            if v:
                print(f"  {k:<28} {spread(v)}  (the collective's own cost; no target)")
            continue
        verdict = "met" if statistics.median(v) >= bounds[k] else "NOT met"
        print(f"  {k:<28} {spread(v)}  (target >= {bounds[k]:.2f}: {verdict})")
    return {"params": n, "fractions": fr, "raw": raw}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--samples", type=int, default=16, help="rows of the mini-batch per rank (one optimizer step)")
    ap.add_argument("--micro", type=int, default=4, help="rows per micro-batch (ppo_micro_batch_size_per_gpu)")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--response", type=int, default=128)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    results = {}
    for world in args.worlds:
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as out:
            mp.start_processes(_worker, args=(world, free_port(), args, out), nprocs=world, join=True,
                               start_method="spawn")
            ranks = [json.loads((Path(out) / f"rank-{r}.json").read_text()) for r in range(world)]
        results[world] = report(world, ranks)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
