"""Issue 21, item 1: peak host memory and start-up time of loading the actor, the old path against the new, per rank.

    .venv/bin/python tools/bench_load.py                      # 1 and 2 ranks, 3 rounds (~4 min here)
    .venv/bin/python tools/bench_load.py --worlds 2 --rounds 1 --layers 2

The model is bench_scale's Qwen2 (hidden 768, 10 layers, vocab 16000, untied: 86.5M parameters, 346 MB in float32),
saved once in bfloat16 (as released checkpoints are) to a temporary directory. Each measurement is a fresh set of
``world`` processes (spawned: nothing inherited), gloo on CPU, each rank:

  old  ``models.build_actor(path)`` (``from_pretrained(..., dtype=float32)``: the whole model) then the trainer's
       sharding (``train.build._sharded`` with the default ``[actor.fsdp]``: on one rank the plain module);
  new  ``train.build.load_sharded``: the model on the meta device, sharded, each rank reading its rows with
       ``safe_open(...).get_slice``.

Per rank: the resident set after the imports and the process group (``VmRSS``), its peak over the load (``VmHWM``,
the kernel's high-water mark of the process), and the load's wall time between two barriers. Rounds interleave the
paths (which goes first alternates). Then a size this machine cannot hold: Llama-3-70B's shape built on the meta
device (time, memory), and each rank's shard bytes at 64 ranks from ``torch.chunk`` on the meta tensors (FSDP2's
rule), against the planner's arithmetic (``hpcppo.sizing.estimate.startup_host_bytes``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from _bench_train_workload import free_port  # noqa: E402

MB = 1e6


def _status(field: str) -> int:
    """A ``/proc/self/status`` size in bytes (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _rank(rank: int, world: int, port: int, path: str, which: str, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    import functools

    import torch.distributed as dist

    from hpcppo import models
    from hpcppo.config.experiment import FsdpSection
    from hpcppo.distributed import env as dist_env
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.train.build import _sharded, load_sharded

    dist_env.init_distributed(dist_env.detect_env(device_type="cpu"), timeout_s=600)
    mesh = build_mesh("cpu", world, 1, hsdp=False)
    shard = functools.partial(_sharded, mesh=mesh, fsdp=FsdpSection(), model_dtype="float32")
    # One throwaway build of the empty model: transformers' lazy imports and module caches are start-up, not load.
    models.build_actor(path, empty=True)
    dist.barrier()
    before = _status("VmRSS")
    t0 = time.perf_counter()
    if which == "old":
        model = shard(models.build_actor(path).to("cpu"))
    else:
        model = load_sharded(functools.partial(models.build_actor, path), path, torch.device("cpu"), shard)
    dist.barrier()
    seconds = time.perf_counter() - t0
    peak = _status("VmHWM")
    after = _status("VmRSS")
    del model
    Path(out, f"{which}-{world}-{rank}.txt").write_text(f"{before} {peak} {after} {seconds}")
    dist.barrier()
    dist.destroy_process_group()


def _measure(world: int, path: str, which: str, tmp: str) -> list[tuple[int, int, int, float]]:
    mp.start_processes(_rank, args=(world, free_port(), path, which, tmp), nprocs=world, join=True,
                       start_method="spawn")
    rows = []
    for rank in range(world):
        before, peak, after, seconds = Path(tmp, f"{which}-{world}-{rank}.txt").read_text().split()
        rows.append((int(before), int(peak), int(after), float(seconds)))
    return rows


def _make_model(directory: Path, hidden: int, layers: int, vocab: int) -> int:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
                      num_key_value_heads=max(1, hidden // 256), intermediate_size=hidden * 8 // 3, vocab_size=vocab,
                      tie_word_embeddings=False, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def _seventy_b(world: int) -> None:
    """Llama-3-70B's shape on the meta device, and the largest shard of a rank at ``world`` ranks."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from hpcppo.models import parameters_on_meta
    from hpcppo.sizing.catalog import KNOWN_MODELS

    cfg = LlamaConfig(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                      intermediate_size=28672, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0,
                      max_position_embeddings=8192)
    rss0 = _status("VmRSS")
    t0 = time.perf_counter()
    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    seconds = time.perf_counter() - t0
    grown = _status("VmRSS") - rss0
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    assert all(p.is_meta for p in params) and not any(b.is_meta for b in model.buffers())
    # FSDP2's rows per rank: torch.chunk along dim 0 (FSDPParam._init_sharded_param), here on meta tensors.
    per_rank = [0] * world
    for p in params:
        for r, part in enumerate(torch.chunk(p, world, dim=0)):
            per_rank[r] += part.numel() * 4
    shape = KNOWN_MODELS.get("llama-3.1-70b")
    print(f"\nLlama-3-70B shape on the meta device: {n / 1e9:.2f}B parameters ({n * 4 / 1e9:.0f} GB in float32), "
          f"built in {seconds:.1f} s, resident set +{grown / MB:.0f} MB (buffers only: rotary inv_freq)")
    print(f"  at {world} ranks (8 nodes x 8 GPUs): largest shard {max(per_rank) / 1e9:.2f} GB, smallest "
          f"{min(per_rank) / 1e9:.2f} GB per rank in float32; old path: {n * 4 / 1e9:.0f} GB on every rank, "
          f"{8 * n * 4 / 1e9:.0f} GB per node of 8")
    if shape is not None:
        print(f"  planner's catalog entry {shape.name}: {shape.params / 1e9:.2f}B parameters")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--no-70b", action="store_true", help="skip the meta-device check of a 70B shape")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hpcppo-bench-load-") as tmp:
        model_dir = Path(tmp) / "model"
        n = _make_model(model_dir, args.hidden, args.layers, args.vocab)
        print(f"model: Qwen2 h{args.hidden} x {args.layers} layers, vocab {args.vocab}: {n / 1e6:.1f}M parameters, "
              f"{n * 4 / MB:.0f} MB in float32 (saved in bfloat16: {n * 2 / MB:.0f} MB)", flush=True)
        results: dict[tuple[int, str], list[tuple[int, int, int, float]]] = {}
        for rnd in range(args.rounds):
            for world in args.worlds:
                for which in (("old", "new") if rnd % 2 == 0 else ("new", "old")):
                    rows = _measure(world, str(model_dir), which, tmp)
                    results.setdefault((world, which), []).extend(rows)
                    print(f"  round {rnd} world {world} {which}: " + "; ".join(
                        f"rank {r}: +{(p - b) / MB:.0f} MB peak, {s:.2f} s" for r, (b, p, _, s) in enumerate(rows)),
                        flush=True)

        def med(xs: list[float], fmt: str) -> str:
            return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}-{fmt.format(max(xs))}]"

        print("\n| ranks | path | RSS before load, MB | peak RSS above it, MB | model / ranks, MB | start-up s |")
        print("|---|---|---|---|---|---|")
        for world in args.worlds:
            for which in ("old", "new"):
                rows = results[(world, which)]
                print(f"| {world} | {which} | {med([b / MB for b, *_ in rows], '{:.0f}')} | "
                      f"{med([(p - b) / MB for b, p, *_ in rows], '{:.0f}')} | {n * 4 / world / MB:.0f} | "
                      f"{med([s for *_, s in rows], '{:.2f}')} |")
            old = statistics.median([(p - b) for b, p, *_ in results[(world, "old")]])
            new = statistics.median([(p - b) for b, p, *_ in results[(world, "new")]])
            print(f"| {world} | new / old | | **{new / old:.2f}** | | "
                  f"**{statistics.median([s for *_, s in results[(world, 'new')]]) / statistics.median([s for *_, s in results[(world, 'old')]]):.2f}** |")
    if not args.no_70b:
        _seventy_b(64)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
