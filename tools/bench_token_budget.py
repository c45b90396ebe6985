"""Issue 21, item 2: token-budget micro-batches against fixed-size padded ones, interleaved in one process.

    .venv/bin/python tools/bench_token_budget.py                 # ~86M Qwen2, 8 rows, 2 rounds (a few minutes)
    .venv/bin/python tools/bench_token_budget.py --layers 2 --hidden 128 --vocab 512 --rounds 1   # smoke

The same rows for both paths: prompts of --prompt-min..--prompt-max tokens (uniform, left padded), responses drawn
from a log-normal (median --median, sigma --sigma) clipped to 16..1024 tokens (right padded), seeded. Per round, in
alternating order, after --warmup unmeasured calls of each:

  update    one optimizer step of the actor as the trainer runs it (``run_update`` with ``actor_loss``, FSDP2 on one
            gloo rank with the trainer's defaults, AdamW): ``padded`` = micro-batches of --micro rows padded to the
            batch's longest prompt and response (``max_tokens_per_micro_batch = 0``, today's path); ``budget`` =
            ``max_tokens_per_micro_batch = --micro x (longest prompt + longest response)`` (the same tokens per
            forward as the padded micro-batches, so the same activation bound), rows packed by length and each
            micro-batch trimmed to its own longest prompt and response; ``packed`` = the same budget with
            ``model.remove_padding`` (each micro-batch's rows packed into one sequence: the budget counts real
            tokens, so fewer and fuller micro-batches);
  log-probs ``compute_log_probs`` over the same rows, without autograd, each way.

Tokens/s counts the rows' real tokens (prompt + response, no padding), the same number for every path. Peak memory
is the largest resident set size above the one before the call, sampled every 2 ms by a thread (glibc is told to
return freed blocks of 64 KiB and more to the system at once, MALLOC_MMAP_THRESHOLD_, so that what one path freed
does not hide what the other allocates).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path

if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # before torch allocates anything: re-run with it set
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    os.execv(sys.executable, [sys.executable, *sys.argv])

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _bench_train_workload import free_port  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def measured(fn) -> tuple[float, int]:
    """(seconds, peak RSS above the start in bytes) of ``fn()``."""
    start, peak, done = rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    done.set()
    t.join()
    return seconds, max(peak[0], rss()) - start


def lengths(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    g = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(args.prompt_min, args.prompt_max + 1, (args.rows,), generator=g).tolist()
    normal = torch.randn(args.rows, generator=g, dtype=torch.float64)
    responses = [int(min(1024, max(16, round(math.exp(math.log(args.median) + args.sigma * z))))) for z in normal]
    return prompts, responses


def batch_of(prompts: list[int], responses: list[int], vocab: int) -> dict:
    from hpcppo.models import position_ids_from_mask

    g = torch.Generator().manual_seed(1)
    rows, p_w, r_w = len(prompts), max(prompts), max(responses)
    prompt_mask = torch.tensor([[0] * (p_w - p) + [1] * p for p in prompts])
    response_mask = torch.tensor([[1] * r + [0] * (r_w - r) for r in responses])
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    ids = torch.randint(1, vocab, (rows, p_w + r_w), generator=g) * attention_mask
    return {"input_ids": ids, "attention_mask": attention_mask, "position_ids": position_ids_from_mask(attention_mask),
            "responses": ids[:, p_w:], "response_mask": response_mask,
            "old_log_probs": (-torch.rand(rows, r_w, generator=g) * 4) * response_mask,
            "advantages": torch.randn(rows, r_w, generator=g) * response_mask}


def run(args: argparse.Namespace) -> dict:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    torch.set_num_threads(args.threads)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hpcppo.config.experiment import ActorSection
    from hpcppo.distributed import env as dist_env
    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.models import compute_log_probs
    from hpcppo.train import batching
    from hpcppo.train.optim import LRSchedule, build_optimizer
    from hpcppo.train.update import UpdateSettings, actor_loss, run_update

    dist_env.init_distributed(dist_env.detect_env(device_type="cpu"), timeout_s=3600)
    cfg = Qwen2Config(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                      num_key_value_heads=max(1, args.hidden // 256), intermediate_size=args.hidden * 8 // 3,
                      vocab_size=args.vocab, tie_word_embeddings=False, max_position_embeddings=4096,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    model.config.use_cache = False
    params = sum(p.numel() for p in model.parameters())
    apply_fsdp(model, build_mesh("cpu", 1, 1, hsdp=False), param_dtype=None, reduce_dtype=torch.float32,
               cpu_offload=False, reshard_after_forward=True)
    actor = ActorSection(ppo_micro_batch_size_per_gpu=args.micro)
    opt = build_optimizer(model, lr=1e-6, weight_decay=actor.weight_decay, betas=actor.betas)
    lr = LRSchedule(opt, base_lr=1e-6, warmup_steps=0, total_steps=100, schedule="constant", min_lr_ratio=0.0)
    loss = actor_loss(model, actor, clip_ratio_low=0.2, clip_ratio_high=0.2, kl_loss=False, temperature=1.0)

    prompts, responses = lengths(args)
    batch = batch_of(prompts, responses, args.vocab)
    width = max(prompts) + max(responses)
    budget = args.budget or args.micro * width
    real = sum(prompts) + sum(responses)
    [groups] = batching.token_budget_groups([batch["attention_mask"]], max(responses), budget)
    [packs] = batching.token_budget_groups([batch["attention_mask"]], max(responses), budget, packed=True)
    computed = {"padded": args.rows * width,
                "budget": sum(len(g) * (max(prompts[i] for i in g.tolist()) + max(responses[i] for i in g.tolist()))
                              for g in groups),
                "packed": real}
    packed_loss = actor_loss(model, actor, clip_ratio_low=0.2, clip_ratio_high=0.2, kl_loss=False, temperature=1.0,
                             packed=True)

    def settings(tokens: int, packed: bool = False) -> UpdateSettings:
        return UpdateSettings(prefix="actor", epochs=1, mini_batch_per_rank=args.rows, micro_batch_per_rank=args.micro,
                              grad_clip=actor.grad_clip, world_size=1, max_response_length=1024,
                              max_tokens_per_micro_batch=tokens, remove_padding=packed)

    def log_probs(packed: bool, tokens: int) -> None:
        micro_batches = batching.token_budget_groups([batch["attention_mask"]], max(responses), tokens,
                                                     packed=packed)[0] if tokens else None
        compute_log_probs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], max(responses),
                          micro_batch_size=args.micro, micro_batches=micro_batches, packed=packed)

    paths = {
        "update/padded": lambda: run_update(batch, model, opt, lr, settings(0), loss),
        "update/budget": lambda: run_update(batch, model, opt, lr, settings(budget), loss),
        "update/packed": lambda: run_update(batch, model, opt, lr, settings(budget, True), packed_loss),
        "logprob/padded": lambda: log_probs(False, 0),
        "logprob/budget": lambda: log_probs(False, budget),
        "logprob/packed": lambda: log_probs(True, budget),
    }
    paths = {k: v for k, v in paths.items() if k.split("/")[1] in args.paths}
    results: dict[str, list[tuple[float, int]]] = {k: [] for k in paths}
    for _ in range(args.warmup):  # first calls pay one-time costs (allocator growth, lazy inits): not measured
        for fn in paths.values():
            fn()
    for r in range(args.rounds):
        order = [k for phase in ("update", "logprob") for k in
                 (sorted if r % 2 == 0 else lambda ks: sorted(ks, reverse=True))([k for k in paths
                                                                                   if k.startswith(phase)])]
        for key in order:
            results[key].append(measured(paths[key]))
            print(f"round {r} {key}: {results[key][-1][0]:.2f} s, peak +{results[key][-1][1] / 2**20:.0f} MiB",
                  flush=True)
    dist_env.destroy_distributed()
    return {"params": params, "rows": args.rows, "prompts": prompts, "responses": responses, "budget": budget,
            "micro_batches": {"padded": math.ceil(args.rows / args.micro), "budget": len(groups),
                              "packed": len(packs)},
            "real_tokens": real, "computed_tokens": computed, "rounds": results}


def report(out: dict) -> str:
    lines = [f"model {out['params'] / 1e6:.1f}M parameters; {out['rows']} rows, responses {sorted(out['responses'])}",
             f"real tokens {out['real_tokens']}; micro-batches of <= {out['budget']} tokens; computed tokens "
             f"(padding included) and micro-batches: " + ", ".join(
                 f"{k} {out['computed_tokens'][k]} in {out['micro_batches'][k]}" for k in out["computed_tokens"])]
    for phase in ("update", "logprob"):
        pad = out["rounds"].get(f"{phase}/padded")
        for name in ("padded", "budget", "packed"):
            rows = out["rounds"].get(f"{phase}/{name}")
            if not rows:
                continue
            secs = [s for s, _ in rows]
            line = (f"{phase:8s} {name:7s} {statistics.median(secs):7.2f} s [{min(secs):.2f}-{max(secs):.2f}] "
                    f"= {out['real_tokens'] / statistics.median(secs):7.1f} tokens/s; peak +"
                    f"{statistics.median([m for _, m in rows]) / 2**20:.0f} MiB")
            if pad and name != "padded":
                speed = [p[0] / b[0] for p, b in zip(pad, rows)]
                mem = [b[1] / p[1] if p[1] else float("nan") for p, b in zip(pad, rows)]
                line += (f"; / padded: {statistics.median(speed):.2f}x tokens/s [{min(speed):.2f}-{max(speed):.2f}], "
                         f"peak memory {statistics.median(mem):.2f}x")
            lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured calls of each path first")
    ap.add_argument("--rows", type=int, default=8, help="rows of the mini-batch (one optimizer step)")
    ap.add_argument("--micro", type=int, default=2, help="rows per padded micro-batch (ppo_micro_batch_size_per_gpu)")
    ap.add_argument("--budget", type=int, default=0, help="tokens per micro-batch; 0 = micro x the padded row width")
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--prompt-min", type=int, default=32)
    ap.add_argument("--prompt-max", type=int, default=128)
    ap.add_argument("--median", type=float, default=160.0, help="median response length (log-normal)")
    ap.add_argument("--sigma", type=float, default=1.0, help="sigma of the log-normal's log")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--paths", nargs="+", default=["padded", "budget", "packed"],
                    choices=["padded", "budget", "packed"], help="which paths to measure")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    out = run(args)
    print(report(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
