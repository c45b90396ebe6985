"""Blocking time of a checkpoint: synchronous save against a background save (checkpoint.async_save) of the same state.

    .venv/bin/python tools/bench_checkpoint.py                  # ~7M-parameter Qwen2 + AdamW state, 5 rounds
    .venv/bin/python tools/bench_checkpoint.py --hidden 512 --layers 8 --vocab 32000 --rounds 3

One process, world size 1 (gloo: the same code paths as a job, DTensor-free plain modules). Each round, alternating:
a synchronous ``CheckpointManager.save`` (blocking = whole save), then a background save (blocking = the staging:
DCP's copy of every tensor to new host memory, plus the RNG and extra bytes), then a training-like stand-in (one
AdamW step on random gradients) while the write goes on, then ``wait()`` (commit). Reported: the blocking times, the
background save's call-to-commit time, and a plain write + fsync of one file of the checkpoint's size; min / median /
max over the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _bench_train_measure import dir_bytes  # noqa: E402
from _bench_train_workload import free_port  # noqa: E402


def spread(v: list[float]) -> str:
    return f"median {statistics.median(v) * 1e3:8.1f} ms  [min {min(v) * 1e3:.1f}, max {max(v) * 1e3:.1f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hpcppo.distributed import env as dist_env
    from hpcppo.distributed.checkpoint import CheckpointManager
    from hpcppo.rundir import RunPaths

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    dist_env.init_distributed(dist_env.detect_env(device_type="cpu"), timeout_s=300)
    cfg = Qwen2Config(hidden_size=args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=max(1, args.hidden // 64), num_key_value_heads=max(1, args.hidden // 128), intermediate_size=args.hidden * 11 // 4,
                      vocab_size=args.vocab, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train_step() -> None:
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()

    train_step()
    n = sum(p.numel() for p in model.parameters())
    sync_b, async_b, async_total, write_s, train_s = [], [], [], [], []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
            mgr = CheckpointManager(RunPaths(tmp).checkpoints, keep_last=2)
            step = 0
            for r in range(args.rounds + 1):
                step += 1
                mgr.save(step, models={"m": model}, optimizers={"m": opt}, extra={"step": step})
                nbytes = dir_bytes(mgr.step_dir(step))
                sb = mgr.last_blocking_s
                step += 1
                mgr.save(step, models={"m": model}, optimizers={"m": opt}, extra={"step": step}, background=True)
                ab = mgr.last_blocking_s
                t0 = time.perf_counter()
                train_step()
                ts = time.perf_counter() - t0
                mgr.wait()
                at = mgr.last_save_s
                data = os.urandom(nbytes)
                t0 = time.perf_counter()
                with open(Path(tmp) / "probe.bin", "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                ws = time.perf_counter() - t0
                os.unlink(Path(tmp) / "probe.bin")
                if r:  # round 0 warms up
                    for values, x in ((sync_b, sb), (async_b, ab), (async_total, at), (write_s, ws), (train_s, ts)):
                        values.append(x)
    finally:
        dist_env.destroy_distributed()
    print(f"== checkpoint blocking time: Qwen2 {n / 1e6:.1f}M params + AdamW state, {nbytes / 1e6:.1f} MB per "
          f"checkpoint, {args.threads} threads, {args.rounds} rounds (sync and background alternating)")
    print(f"  synchronous save, blocking (= whole save):     {spread(sync_b)}")
    print(f"  background save, blocking (staging copy):      {spread(async_b)}")
    print(f"  background save, call to commit:               {spread(async_total)}")
    print(f"  training stand-in during the write (AdamW):    {spread(train_s)}")
    print(f"  plain write + fsync of {nbytes / 1e6:.1f} MB:              {spread(write_s)}")
    ratio = statistics.median(async_b) / statistics.median(sync_b)
    print(f"  blocking, background / synchronous (medians):  {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
