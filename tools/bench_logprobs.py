"""Issue 21: peak memory of the log-prob pass at a 150k vocabulary, whole logits against chunks, in one run.

    .venv/bin/python tools/bench_logprobs.py                    # micro-batch 2 x 512 response tokens, 3 rounds
    .venv/bin/python tools/bench_logprobs.py --micro 1 --response 256 --rounds 1

A Qwen2 with Qwen2.5's vocabulary (151,936; hidden 256, 2 layers, float32, untied) scores ``--micro`` rows of
``--prompt + --response`` tokens three ways, as the trainer does: the old/reference log-probs (no autograd), and the
actor's loss pass (log-probs + entropy, forward and backward) without and with an entropy bonus. Each pass runs:

  whole    the code before issue 21, kept here verbatim: the model's logits for the ``R + 1`` last positions
           (``logits_to_keep``), ``.float()``, ``gather - logsumexp`` and the entropy over the whole
           ``[micro, R, vocab]`` block;
  chunked  ``hpcppo.models.forward_log_probs`` with its default chunk (``LOGITS_CHUNK_ELEMENTS``) or ``--chunk``.

Peak memory is what torch's memory profiler sees alive (``torch.profiler._memory_profiler``, as
tests/unit/test_plan_activations.py measures the planner), minus the model's weights: the bytes the pass adds,
including, in an update, the parameters' gradients made by its backward (the same in both paths). Rounds interleave the two paths (which goes first alternates); medians [min-max] of
the pass's wall time are printed beside it, and the largest difference of the log-probs (and of the LM head's
gradient in an update) between the two paths.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from hpcppo import models  # noqa: E402
from hpcppo.algos.losses import entropy_from_logits, entropy_metric  # noqa: E402

MiB = 2**20


def whole_logits(model, ids, mask, pos, response_len, *, with_entropy, entropy_grad):
    """``hpcppo.models.forward_log_probs`` as it was before chunking (temperature 1)."""
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, logits_to_keep=response_len + 1)
    logits = out.logits[:, -response_len - 1:-1, :].float()
    targets = ids[:, -response_len:].unsqueeze(-1)
    log_probs = logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    entropy = None
    if with_entropy:
        entropy = entropy_from_logits(logits) if entropy_grad else entropy_metric(logits)
    return log_probs, entropy


def chunked(model, ids, mask, pos, response_len, *, with_entropy, entropy_grad, chunk):
    return models.forward_log_probs(model, ids, mask, pos, response_len, with_entropy=with_entropy,
                                    entropy_grad=entropy_grad, chunk_elements=chunk)


def peak_bytes(fn) -> int:
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(torch.device("cpu"))
    return max(sum(s) for s in sizes)


def build(vocab: int, hidden: int, layers: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=4 * hidden, vocab_size=vocab, max_position_embeddings=4096,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    return Qwen2ForCausalLM(cfg).train()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--response", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=None, help="logits per chunk (default LOGITS_CHUNK_ELEMENTS)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    chunk = args.chunk or models.LOGITS_CHUNK_ELEMENTS
    model = build(args.vocab, args.hidden, args.layers)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.micro, args.prompt + args.response), generator=g)
    mask = torch.ones_like(ids)
    pos = models.position_ids_from_mask(mask)
    R = args.response
    logits_mib = args.micro * R * args.vocab * 4 / MiB
    positions = models.forward._chunk_positions(args.micro, R, args.vocab, chunk)
    print(f"model: Qwen2 h{args.hidden} x {args.layers} layers, vocab {args.vocab}, {params / MiB:.0f} MiB float32; "
          f"micro-batch {args.micro} x ({args.prompt} + {R}) tokens; float32 logits of the micro-batch: "
          f"{logits_mib:.0f} MiB; chunk: {min(positions, R)} positions ({chunk} logits)", flush=True)

    passes = {"log-probs (no grad)": dict(grad=False, bonus=False),
              "update, entropy metric": dict(grad=True, bonus=False),
              "update, entropy bonus": dict(grad=True, bonus=True)}
    paths = {"whole": lambda **kw: whole_logits(model, ids, mask, pos, R, **kw),
             "chunked": lambda **kw: chunked(model, ids, mask, pos, R, chunk=chunk, **kw)}
    results: dict[tuple[str, str], dict[str, list[float]]] = {}
    outputs: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor | None]] = {}
    for rnd in range(args.rounds):
        for name, p in passes.items():
            order = list(paths) if rnd % 2 == 0 else list(paths)[::-1]
            for path in order:
                model.zero_grad(set_to_none=True)
                fn = paths[path]
                kept = {}

                def run():
                    if p["grad"]:
                        lp, ent = fn(with_entropy=True, entropy_grad=p["bonus"])
                        (lp.sum() + (ent.sum() * 0.01 if p["bonus"] else 0)).backward()
                    else:
                        with torch.no_grad():
                            lp, ent = fn(with_entropy=False, entropy_grad=False)
                    kept["lp"] = lp.detach()

                t0 = time.perf_counter()
                run()
                seconds = time.perf_counter() - t0
                model.zero_grad(set_to_none=True)
                peak = peak_bytes(run) - params
                head_grad = model.lm_head.weight.grad.clone() if p["grad"] else None
                model.zero_grad(set_to_none=True)
                r = results.setdefault((name, path), {"peak": [], "s": []})
                r["peak"].append(peak)
                r["s"].append(seconds)
                outputs[(name, path)] = (kept["lp"], head_grad)

    def med(xs):
        return f"{statistics.median(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]"

    print("\n| pass | whole: peak MiB | chunked: peak MiB | chunked / whole | whole: s | chunked: s | "
          "max |diff| log-probs | max |diff| LM-head grad |")
    print("|---|---|---|---|---|---|---|---|")
    for name in passes:
        w, c = results[(name, "whole")], results[(name, "chunked")]
        ratio = statistics.median(c["peak"]) / statistics.median(w["peak"])
        (lw, gw), (lc, gc) = outputs[(name, "whole")], outputs[(name, "chunked")]
        dlp = (lw - lc).abs().max().item()
        dg = "-" if gw is None else f"{(gw - gc).abs().max().item():.2e}"
        print(f"| {name} | {statistics.median(w['peak']) / MiB:.0f} | {statistics.median(c['peak']) / MiB:.0f} | "
              f"**{ratio:.3f}** | {med(w['s'])} | {med(c['s'])} | {dlp:.2e} | {dg} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
