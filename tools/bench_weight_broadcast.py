"""Issue 35, point 3: the split placement's weight bridge against a plain broadcast of the same bytes, in one run.

    .venv/bin/python tools/bench_weight_broadcast.py                    # ~1-2 minutes on 2 cores
    .venv/bin/python tools/bench_weight_broadcast.py --mb 64 --bucket-mb 1,8,32 --rounds 5 --json out.json

Three processes with gloo on CPU (TCP loopback), one thread each; their default process group (all three) only
times the rounds (a barrier before, the slowest rank's time after) and holds the reference groups. Interleaved
rounds, the order of the two sides swapped every round:

  bridge       ``Bridge.broadcast_weights`` of a model-shaped set of tensors (``--mb`` MB of fp32 and bf16 tensors of
               many sizes, some larger than a bucket) from process 0 to processes 1 and 2 (a bridge of three), the
               receivers dropping the views (the bridge alone), and again loading every tensor into their own copy
               as an engine does (``into`` for the large ones, ``copy_`` out of the buckets for the rest), against
               ``plain``: one ``dist.broadcast`` of a flat tensor of the same bytes on a group of the same three
               ranks, received in place: the transport's bound;
  full sync    the split placement's sync: processes 0 and 1 are the trainer (FSDP2 over a group of the two),
               ``iter_full_params`` on both gathers the full weights in buckets, process 0 feeds them to a bridge
               of two (process 0 and process 2, the rollout rank, outside the trainer's group), which loads them
               into its model (``into`` its parameters, then ``load_into``); against one ``dist.broadcast`` of the
               same bytes on a group of processes 0 and 2; and ``iter_full_params`` alone on the trainers (the
               gather, the other half of a sync).

Each figure is bytes per second of the slowest rank (bytes / max over ranks of its seconds), median [min-max]; the
ratio is bridge / plain of the same round (1.0: the bridge costs nothing over the transport).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
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

WORLD = 3


def model_shaped(total_bytes: int, seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    """``total_bytes`` (about) of named tensors shaped like a decoder's: per layer two large fp32 matrices, four
    smaller ones, a bf16 one and two small norms, and an embedding of a quarter of the bytes (larger than a bucket
    at the default sizes)."""
    g = torch.Generator().manual_seed(seed)
    out = [("embed", torch.randn(max(1, total_bytes // 16), generator=g))]  # a quarter of the bytes, fp32
    left, i = total_bytes - out[0][1].numel() * 4, 0
    while left > 0:
        big = max(1, min(left // 2, 3 << 20) // 4)  # up to 3 MB each: several share a bucket
        for name, n, dtype in ((f"l{i}.q", big, torch.float32), (f"l{i}.up", big, torch.float32),
                               (f"l{i}.k", big // 4 + 1, torch.float32), (f"l{i}.v", big // 4 + 1, torch.float32),
                               (f"l{i}.o", big // 5 + 3, torch.bfloat16), (f"l{i}.norm", 257, torch.float32),
                               (f"l{i}.bias", 131, torch.bfloat16)):
            out.append((name, torch.randn(n, generator=g).to(dtype)))
            left -= n * dtype.itemsize
        i += 1
    return out


def _worker(rank: int, args: argparse.Namespace, ports: dict, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports["default"]), RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hpcppo.distributed.bridge import Bridge
    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.weights import iter_full_params, load_into

    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timeout)
    all3 = dist.new_group([0, 1, 2])
    trainer = dist.new_group([0, 1])  # every rank creates every group, in the same order
    pair = dist.new_group([0, 2])
    buckets = [int(float(b) * (1 << 20)) for b in args.bucket_mb.split(",")]
    bridges = {b: Bridge.connect("127.0.0.1", ports[f"three-{b}"], rank, WORLD, timeout_s=args.timeout,
                                 bucket_bytes=b) for b in buckets}
    two = {b: Bridge.connect("127.0.0.1", ports[f"two-{b}"], 0 if rank == 0 else 1, 2, timeout_s=args.timeout,
                             bucket_bytes=b) for b in buckets} if rank != 1 else {}

    tensors = model_shaped(int(args.mb * (1 << 20)))
    nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
    mine = {n: torch.empty_like(t) for n, t in tensors}  # the receivers' engine copies
    flat = torch.ones(nbytes, dtype=torch.uint8) if rank == 0 else torch.empty(nbytes, dtype=torch.uint8)

    cfg = Qwen2Config(hidden_size=args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=max(1, args.hidden // 64),
                      num_key_value_heads=max(1, args.hidden // 256), intermediate_size=args.hidden * 8 // 3,
                      vocab_size=args.vocab, tie_word_embeddings=False, max_position_embeddings=256)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if rank < 2:
        apply_fsdp(model, DeviceMesh.from_group(trainer, "cpu"), param_dtype=None, reduce_dtype=None,
                   cpu_offload=False, reshard_after_forward=True)
    targets = dict(model.named_parameters())  # the rollout rank's engine tensors (rank 2's model is unsharded)
    model_flat = (torch.ones if rank == 0 else torch.empty)(model_bytes, dtype=torch.uint8)

    def bridge_side(b: int, load: bool) -> None:
        if rank == 0:
            bridges[b].broadcast_weights(iter(tensors), version=1)
        elif load:  # as an engine loads: the large tensors straight into its own, the others copied out of buckets
            _, it = bridges[b].receive_weights(into=mine)
            for n, t in it:
                mine[n].copy_(t)  # a no-op for a tensor received into mine[n] itself
        else:
            _, it = bridges[b].receive_weights()
            for _ in it:
                pass

    def plain_side() -> None:
        dist.broadcast(flat, src=0, group=all3)

    def sync_side(b: int) -> None:
        if rank == 0:
            two[b].broadcast_weights(iter_full_params(model), version=1)
        elif rank == 1:
            for _ in iter_full_params(model):  # a trainer rank outside the bridge: its part of the gathers
                pass
        else:
            _, it = two[b].receive_weights(into=targets)
            load_into(model, it)

    def gather_only() -> None:
        if rank < 2:
            for _ in iter_full_params(model):
                pass

    def sync_plain() -> None:
        if rank != 1:
            dist.broadcast(model_flat, src=0, group=pair)

    def timed(fn) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    sides = {**{f"bridge-{b}": (lambda b=b: bridge_side(b, False)) for b in buckets},
             **{f"load-{b}": (lambda b=b: bridge_side(b, True)) for b in buckets}, "plain": plain_side,
             **{f"sync-{b}": (lambda b=b: sync_side(b)) for b in buckets}, "sync-plain": sync_plain,
             "gather": gather_only}
    rec: dict[str, list[float]] = {k: [] for k in sides}
    order = list(sides)
    for r in range(args.rounds + args.warmup):
        for name in (order if r % 2 == 0 else order[::-1]):
            s = timed(sides[name])
            if r >= args.warmup:
                rec[name].append(s)
    if rank == 2:  # what arrived is what was sent (the last round's)
        assert all(torch.equal(mine[n], t) for n, t in tensors), "the bridge delivered other bytes"
    for bridge in [*bridges.values(), *two.values()]:
        bridge.close()
    if rank == 0:
        Path(out).write_text(json.dumps({"bytes": nbytes, "model_bytes": model_bytes, "tensors": len(tensors),
                                         "params": sum(p.numel() for p in model.parameters()), "seconds": rec,
                                         "buckets": buckets}))
    dist.destroy_process_group()


def spread(v: list[float]) -> str:
    return f"{statistics.median(v):7.3f} [{min(v):.3f}-{max(v):.3f}]"


def report(r: dict) -> dict:
    sec, out = r["seconds"], {"rounds": r["seconds"], "bytes": r["bytes"], "model_bytes": r["model_bytes"]}
    model_sides = ("sync", "gather")
    gbps = {k: [(r["model_bytes"] if k.startswith(model_sides) else r["bytes"]) / s / 1e9 for s in v]
            for k, v in sec.items()}
    print(f"\n== bridge of 3 (1 sender, 2 receivers) vs one dist.broadcast of the same {r['bytes'] / 1e6:.1f} MB "
          f"({r['tensors']} tensors, fp32 and bf16) on a group of the same 3 ranks")
    print(f"  {'plain broadcast':34s} {spread(gbps['plain'])} GB/s")
    ratios: dict[str, dict] = {}
    for kind, label in (("bridge", "bridge"), ("load", "bridge + load")):
        for b in r["buckets"]:
            per = [p / q for p, q in zip(sec["plain"], sec[f"{kind}-{b}"])]
            ratios[f"{kind}-{b}"] = {"median": statistics.median(per), "min": min(per), "max": max(per)}
            print(f"  {label + ', ' + format(b / (1 << 20), 'g') + ' MB buckets':34s} {spread(gbps[f'{kind}-{b}'])} "
                  f"GB/s   bridge / plain {statistics.median(per):.2f}x [{min(per):.2f}-{max(per):.2f}]")
    print(f"\n== full sync: 2 FSDP2 trainer ranks -> iter_full_params -> bridge -> 1 rollout rank (load_into), "
          f"{r['params'] / 1e6:.1f}M params, {r['model_bytes'] / 1e6:.1f} MB fp32, vs one dist.broadcast of the same "
          f"bytes on a group of the bridge's 2 ranks")
    print(f"  {'plain broadcast':34s} {spread(gbps['sync-plain'])} GB/s")
    per = [p / q for p, q in zip(sec["sync-plain"], sec["gather"])]
    ratios["gather"] = {"median": statistics.median(per), "min": min(per), "max": max(per)}
    print(f"  {'iter_full_params alone (trainers)':34s} {spread(gbps['gather'])} GB/s   "
          f"gather / plain {statistics.median(per):.2f}x [{min(per):.2f}-{max(per):.2f}]")
    for b in r["buckets"]:
        per = [p / q for p, q in zip(sec["sync-plain"], sec[f"sync-{b}"])]
        ratios[f"sync-{b}"] = {"median": statistics.median(per), "min": min(per), "max": max(per)}
        print(f"  {'full sync, ' + format(b / (1 << 20), 'g') + ' MB buckets':34s} {spread(gbps[f'sync-{b}'])} GB/s   "
              f"sync / plain {statistics.median(per):.2f}x [{min(per):.2f}-{max(per):.2f}]")
    print("  (GB/s of the slowest rank, median [min-max]; a ratio is the plain broadcast's time over the other "
          "side's in the same round)")
    out.update(gbps=gbps, ratios=ratios)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=128, help="MB of tensors in the bridge vs plain comparison")
    p.add_argument("--bucket-mb", default="8", help="bucket sizes to measure, comma-separated (MB)")
    p.add_argument("--hidden", type=int, default=512, help="the full sync's Qwen2 hidden size")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--rounds", type=int, default=5, help="measured rounds")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    buckets = [int(float(b) * (1 << 20)) for b in args.bucket_mb.split(",")]
    ports = {"default": free_port(), **{f"three-{b}": free_port() for b in buckets},
             **{f"two-{b}": free_port() for b in buckets}}
    with tempfile.TemporaryDirectory(prefix="bench-bridge-") as tmp:
        out = str(Path(tmp) / "rank0.json")
        # the ranks fork from one server that imported these once (as tests/dist/_spawn.py does): three imports of
        # torch and transformers on a busy 2-core machine cost more than the measurement
        multiprocessing.set_forkserver_preload(["torch", "torch.distributed.fsdp", "transformers",
                                                "transformers.models.qwen2.modeling_qwen2",
                                                "hpcppo.distributed.bridge", "hpcppo.distributed.weights"])
        mp.start_processes(_worker, args=(args, ports, out), nprocs=WORLD, join=True, start_method="forkserver")
        result = report(json.loads(Path(out).read_text()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
