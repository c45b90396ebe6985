"""The report of tools/bench_train.py: every figure from the raw measurements, and how they are printed.

A helper module of the benchmark script (tools/ is not a package: the script's directory is on sys.path).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
from typing import Any

import torch
from _bench_train_workload import MINI_BATCHES, PROMPTS, RESPONSE_LEN

PHASES = ("weight_sync", "generate", "reward", "old_logprob", "ref", "values", "adv", "critic_update", "actor_update",
          "checkpoint")


def med(values) -> float:
    values = [float(v) for v in values]
    return statistics.median(values) if values else float("nan")


def figures(warmup: int, trainer, meas, **measured: Any) -> dict[str, Any]:
    """Every figure of the report from the raw measurements (medians over the measured steps)."""
    hp = {ph: med(meas[f"time/{ph}_s"]) for ph in PHASES}
    samples, width, resp_w = trainer.shapes[-1]
    # 1 epoch: every sample passes once, forward and backward, through the actor and through the critic.
    flops = 6 * (measured["actor_n"] + measured["critic_n"]) * samples * width
    step_s = med(meas["perf/step_time_s"])
    return {
        "threads": torch.get_num_threads(),
        "phases_s": hp,
        "steps_s": [float(v) for v in meas["perf/step_time_s"]],
        "step_time_s": step_s,
        "shape": {"samples": samples, "width": width, "response": resp_w},
        "response_widths": sorted({s[2] for s in trainer.shapes[warmup:]}),
        "tokens_per_s": {"trainer_metric": med(meas["perf/tokens_per_s"]),
                         "generate": samples * resp_w / hp["generate"]},
        "update": {"flops": flops, "s": hp["actor_update"] + hp["critic_update"],
                   "matmul_peak_flops_per_s": measured["peak"]},
        "weight_sync": {"bytes": measured["sync_bytes"], "bytes_per_s": measured["sync_bytes"] / hp["weight_sync"],
                        "copy_bytes_per_s": measured["copy_bps"]},
        "checkpoint": {"bytes": measured["ckpt_bytes"], "bytes_per_s": measured["ckpt_bytes"] / hp["checkpoint"],
                       "file_write_bytes_per_s": measured["write_bps"]},
        "update_breakdown_ms": measured["breakdown"],
        "params": {"actor": measured["actor_n"], "critic": measured["critic_n"]},
        "fsdp": measured["fsdp"],
    }


def print_phases(f: dict[str, Any], steps: int, warmup: int) -> None:
    hp, sh, p = f["phases_s"], f["shape"], f["params"]
    print(f"== hpcppo training benchmark: Qwen2 h128 L2 (actor {p['actor']:,} params, critic {p['critic']:,}), "
          f"{PROMPTS} prompts x {RESPONSE_LEN} new tokens, 1 PPO epoch x {MINI_BATCHES} mini-batches, GAE + critic + "
          f"reference (KL in reward), checkpoint every step")
    print(f"   torch {torch.__version__}, {f['threads']} threads, world size 1 (gloo; actor/critic/reference "
          f"{'FSDP2-wrapped' if f['fsdp'] else 'not wrapped'}), {warmup} warm-up + {steps} measured steps, medians; "
          f"response widths {f['response_widths']}, sequence width (prompt+response) {sh['width']}")
    print()
    total = sum(hp.values())
    print(f"{'phase (s, median)':<34}{'hpcppo':>10}{'share':>8}")
    for ph in PHASES:
        print(f"  {ph:<32}{hp[ph]:10.4f}{hp[ph] / total:8.1%}")
    print(f"  {'trainer perf/step_time_s':<32}{f['step_time_s']:10.4f}   (per step: "
          f"{' '.join(f'{x:.3f}' for x in f['steps_s'])})")
    print("  (how this compares with TRL and a cleanrl-style loop on the same passes: tools/bench_peers.py)")


def print_ratios(f: dict[str, Any]) -> None:
    t, u, sh, p = f["tokens_per_s"], f["update"], f["shape"], f["params"]
    print("\nthroughput")
    print(f"  trainer's perf/tokens_per_s (unpadded, checkpoint included): {t['trainer_metric']:,.0f}; generated "
          f"tokens/s in the generate phase: {t['generate']:,.0f}")
    peak = u["matmul_peak_flops_per_s"]
    print("\nupdate phase (actor + critic)")
    print(f"  FLOPs ~ 6 x (N_actor + N_critic) x tokens = 6 x ({p['actor']:,} + {p['critic']:,}) x ({sh['samples']} x "
          f"{sh['width']}) = {u['flops'] / 1e9:.3f} GFLOP per step (forward 2N + backward 4N per token; attention "
          f"scores not counted)")
    print(f"  achieved {u['flops'] / u['s'] / 1e9:.2f} GFLOP/s ({u['s']:.4f} s); matmul peak (float32 1024x1024 "
          f"torch.mm, same threads): {peak / 1e9:.1f} GFLOP/s -> fraction of peak {u['flops'] / u['s'] / peak:.3f}")
    ws, ck = f["weight_sync"], f["checkpoint"]
    print("\nweight sync (actor -> HF rollout engine)")
    print(f"  {ws['bytes'] / 1e6:.2f} MB in {ws['bytes'] / ws['bytes_per_s'] * 1e3:.2f} ms = "
          f"{ws['bytes_per_s'] / 1e9:.3f} GB/s; plain tensor copy of the same bytes: "
          f"{ws['copy_bytes_per_s'] / 1e9:.2f} GB/s -> {ws['copy_bytes_per_s'] / ws['bytes_per_s']:.1f}x slower than "
          "a copy")
    print("checkpoint (DCP: actor + critic weights and AdamW states, extra state, RNG, marker)")
    print(f"  {ck['bytes'] / 1e6:.2f} MB in {ck['bytes'] / ck['bytes_per_s'] * 1e3:.1f} ms = "
          f"{ck['bytes_per_s'] / 1e6:.1f} MB/s; write + fsync of one file of the same size: "
          f"{ck['file_write_bytes_per_s'] / 1e6:.1f} MB/s -> {ck['file_write_bytes_per_s'] / ck['bytes_per_s']:.1f}x "
          f"slower than a plain write")
    print("  (at this size fixed costs swamp bandwidth; tools/bench_scale.py measures both at 86.5M parameters)")
    print(f"\none actor mini-batch update ({sh['samples'] // MINI_BATCHES} x {sh['width']} tokens), median ms:")
    for name, parts in f["update_breakdown_ms"].items():
        cols = "  ".join(f"{k} {v:6.2f}" for k, v in parts.items())
        print(f"  {name:<26}{cols}  total {sum(parts.values()):6.2f}")


def print_profile(profiler: cProfile.Profile) -> None:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(40)
    stats.sort_stats("tottime").print_stats(25)
    print("\n== cProfile of the trainer's measured steps")
    print(out.getvalue())
