"""The report of tools/bench_train.py: every figure from the raw measurements, and how they are printed.

A helper module of the benchmark script (tools/ is not a package: the script's directory is on sys.path).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
from typing import TYPE_CHECKING, Any

import torch
from _bench_train_workload import MINI_BATCHES, PROMPTS, RESPONSE_LEN

if TYPE_CHECKING:
    from _bench_train_minimal import MinimalPPO

OVERHEAD_LIMIT = 1.20  # median hpcppo iteration / median minimal iteration (checkpoint excluded): PASS at or below

PHASES = ("weight_sync", "generate", "reward", "old_logprob", "ref", "values", "adv", "critic_update", "actor_update",
          "checkpoint")


def med(values) -> float:
    values = [float(v) for v in values]
    return statistics.median(values) if values else float("nan")


def figures(warmup: int, trainer, minimal: MinimalPPO, meas, **measured: Any) -> dict[str, Any]:
    """Every figure of the report from the raw measurements (medians over the measured steps)."""
    hp_iter, mn_iter = med(trainer.iter_times[warmup:]), med(trainer.min_times[warmup:])
    hp = {ph: med(meas[f"time/{ph}_s"]) for ph in PHASES}
    mn = {ph: med(v[warmup:]) for ph, v in minimal.phases.items()}
    samples, width, resp_w = trainer.shapes[-1]
    widths = {"hpcppo": sorted({s[2] for s in trainer.shapes}), "minimal": sorted(set(minimal.widths))}
    # 1 epoch: every sample passes once, forward and backward, through the actor and through the critic.
    flops = 6 * (measured["actor_n"] + measured["critic_n"]) * samples * width
    ratio = hp_iter / mn_iter
    return {
        "pass": ratio <= OVERHEAD_LIMIT and widths["hpcppo"] == widths["minimal"] == [RESPONSE_LEN],
        "overhead_ratio": ratio, "limit": OVERHEAD_LIMIT, "threads": torch.get_num_threads(),
        "iteration_s": {"hpcppo": hp_iter, "minimal": mn_iter},
        "iterations_s": {"hpcppo": trainer.iter_times[warmup:], "minimal": trainer.min_times[warmup:]},
        "phases_s": {"hpcppo": hp, "minimal": mn},
        "shape": {"samples": samples, "width": width, "minimal_width": minimal.last_width, "response": resp_w},
        "response_widths": widths,
        "tokens_per_s": {"hpcppo": samples * width / hp_iter, "minimal": samples * minimal.last_width / mn_iter,
                         "trainer_metric": med(meas["perf/tokens_per_s"]),
                         "generate_hpcppo": samples * resp_w / hp["generate"],
                         "generate_minimal": samples * resp_w / mn["generate"]},
        "step_time_s": med(meas["perf/step_time_s"]),
        "update": {"flops": flops, "hpcppo_s": hp["actor_update"] + hp["critic_update"],
                   "minimal_s": mn["actor_update"] + mn["critic_update"], "matmul_peak_flops_per_s": measured["peak"]},
        "weight_sync": {"bytes": measured["sync_bytes"], "bytes_per_s": measured["sync_bytes"] / hp["weight_sync"],
                        "copy_bytes_per_s": measured["copy_bps"]},
        "checkpoint": {"bytes": measured["ckpt_bytes"], "bytes_per_s": measured["ckpt_bytes"] / hp["checkpoint"],
                       "file_write_bytes_per_s": measured["write_bps"]},
        "update_breakdown_ms": measured["breakdown"],
        "params": {"actor": measured["actor_n"], "critic": measured["critic_n"]},
        "fsdp": measured["fsdp"],
    }


def print_phases(f: dict[str, Any], steps: int, warmup: int) -> None:
    hp, mn, sh, p = f["phases_s"]["hpcppo"], f["phases_s"]["minimal"], f["shape"], f["params"]
    print(f"== hpcppo training benchmark: Qwen2 h128 L2 (actor {p['actor']:,} params, critic {p['critic']:,}), "
          f"{PROMPTS} prompts x {RESPONSE_LEN} new tokens, 1 PPO epoch x {MINI_BATCHES} mini-batches, GAE + critic + "
          f"reference (KL in reward), checkpoint every step")
    print(f"   torch {torch.__version__}, {f['threads']} threads, world size 1 (gloo; actor/critic/reference "
          f"{'FSDP2-wrapped' if f['fsdp'] else 'not wrapped'}), {warmup} warm-up + {steps} measured steps, medians")
    print(f"   response widths: hpcppo {f['response_widths']['hpcppo']}, minimal {f['response_widths']['minimal']}; "
          f"sequence width (prompt+response) hpcppo {sh['width']}, minimal {sh['minimal_width']}")
    print()
    print(f"{'phase (s, median)':<34}{'hpcppo':>10}{'minimal':>10}{'ratio':>8}{'hpcppo - minimal':>18}")
    for ph in PHASES:
        m = mn.get(ph)
        cols = f"{m:10.4f}{hp[ph] / m:8.2f}{hp[ph] - m:+18.4f}" if m else f"{'-':>10}{'':8}{hp[ph]:+18.4f}"
        print(f"  {ph:<32}{hp[ph]:10.4f}{cols}")
    it = f["iteration_s"]
    print(f"  {'iteration (checkpoint excluded)':<32}{it['hpcppo']:10.4f}{it['minimal']:10.4f}"
          f"{it['hpcppo'] / it['minimal']:8.2f}{it['hpcppo'] - it['minimal']:+18.4f}")
    print(f"  {'trainer perf/step_time_s':<32}{f['step_time_s']:10.4f}")


def print_ratios(f: dict[str, Any]) -> None:
    t, u, sh, p = f["tokens_per_s"], f["update"], f["shape"], f["params"]
    print("\nthroughput")
    print(f"  tokens/s (prompt+response tokens / iteration, checkpoint excluded): hpcppo {t['hpcppo']:,.0f}, minimal "
          f"{t['minimal']:,.0f}; trainer's perf/tokens_per_s (unpadded, checkpoint included): "
          f"{t['trainer_metric']:,.0f}")
    print(f"  generated tokens/s in the generate phase: hpcppo {t['generate_hpcppo']:,.0f}, "
          f"minimal {t['generate_minimal']:,.0f}")
    peak = u["matmul_peak_flops_per_s"]
    print("\nupdate phase (actor + critic)")
    print(f"  FLOPs ~ 6 x (N_actor + N_critic) x tokens = 6 x ({p['actor']:,} + {p['critic']:,}) x ({sh['samples']} x "
          f"{sh['width']}) = {u['flops'] / 1e9:.3f} GFLOP per step (forward 2N + backward 4N per token; attention "
          f"scores not counted)")
    print(f"  achieved: hpcppo {u['flops'] / u['hpcppo_s'] / 1e9:.2f} GFLOP/s ({u['hpcppo_s']:.4f} s), minimal "
          f"{u['flops'] / u['minimal_s'] / 1e9:.2f} GFLOP/s ({u['minimal_s']:.4f} s)")
    print(f"  matmul peak (float32 1024x1024 torch.mm, same threads): {peak / 1e9:.1f} GFLOP/s -> fraction of peak: "
          f"hpcppo {u['flops'] / u['hpcppo_s'] / peak:.3f}, minimal {u['flops'] / u['minimal_s'] / peak:.3f}")
    ws, ck = f["weight_sync"], f["checkpoint"]
    print("\nweight sync (actor -> HF rollout engine, parameter by parameter)")
    print(f"  {ws['bytes'] / 1e6:.2f} MB in {ws['bytes'] / ws['bytes_per_s'] * 1e3:.2f} ms = "
          f"{ws['bytes_per_s'] / 1e9:.3f} GB/s; plain tensor copy of the same bytes: "
          f"{ws['copy_bytes_per_s'] / 1e9:.2f} GB/s -> {ws['copy_bytes_per_s'] / ws['bytes_per_s']:.1f}x slower than "
          "a copy")
    print("checkpoint (DCP: actor + critic weights and AdamW states, extra state, RNG, marker)")
    print(f"  {ck['bytes'] / 1e6:.2f} MB in {ck['bytes'] / ck['bytes_per_s'] * 1e3:.1f} ms = "
          f"{ck['bytes_per_s'] / 1e6:.1f} MB/s; write + fsync of one file of the same size: "
          f"{ck['file_write_bytes_per_s'] / 1e6:.1f} MB/s -> {ck['file_write_bytes_per_s'] / ck['bytes_per_s']:.1f}x "
          f"slower than a plain write")
    print(f"\none actor mini-batch update ({sh['samples'] // MINI_BATCHES} x {sh['width']} tokens), median ms:")
    for name, parts in f["update_breakdown_ms"].items():
        cols = "  ".join(f"{k} {v:6.2f}" for k, v in parts.items())
        print(f"  {name:<26}{cols}  total {sum(parts.values()):6.2f}")
    it = f["iteration_s"]
    print(f"\noverhead vs the minimal PPO loop: {it['hpcppo']:.4f} s / {it['minimal']:.4f} s = "
          f"{f['overhead_ratio']:.3f} (limit {OVERHEAD_LIMIT:.2f}) -> {'PASS' if f['pass'] else 'FAIL'}")
    for side in ("hpcppo", "minimal"):
        print(f"  per-iteration seconds, {side + ':':<9}{' '.join(f'{x:.3f}' for x in f['iterations_s'][side])}")
    if not f["response_widths"]["hpcppo"] == f["response_widths"]["minimal"] == [RESPONSE_LEN]:
        print(f"  FAIL: the loops did not both generate exactly {RESPONSE_LEN} tokens; the comparison is void")


def print_profile(profiler: cProfile.Profile) -> None:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(40)
    stats.sort_stats("tottime").print_stats(25)
    print("\n== cProfile of the trainer's measured steps (minimal iterations excluded)")
    print(out.getvalue())
