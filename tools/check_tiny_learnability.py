#!/usr/bin/env python3
"""Does RL improve the warm-started tiny model? A minimal single-process policy-gradient loop.

Not a test and not the trainer: it shows that the task and the warm start leave headroom that a
short RL run can take. Each step samples ``--samples`` completions (temperature ``--temperature``)
for ``--prompts`` training prompts, scores them with ``hpcppo.data.synthetic.compute_score``, uses
the group-mean baseline (GRPO without std normalisation) as advantage and takes one Adam step on
the token-mean policy-gradient loss. Prints the mean reward per step and held-out accuracy
(greedy and sampled) before and after.

    .venv/bin/python tools/check_tiny_learnability.py --model artifacts/tiny-arith/model --build

Measured on the default build (seed 0, format 2), 1 thread: 32 prompts x 4 samples, Adam lr
1e-4..3e-4, temperature 1: reward 0.27 at step 0 -> ~0.65 by step 3, ~0.85-0.9 over the last 5 of
30 steps (about 6 s); held-out sampled accuracy 0.23 -> 0.83-0.90, greedy stays ~1. lr 3e-3 collapses.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hpcppo.data import synthetic  # noqa: E402
from hpcppo import tiny  # noqa: E402
from hpcppo.models import position_ids_from_mask  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="directory built by `hpcppo tools make-model`")
    ap.add_argument("--build", action="store_true", help="build the model into --model first (idempotent)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.build:
        info = tiny.build_tiny_model_and_data(args.model, seed=args.seed)
        ws = info["warm_start"]
        print(f"built={info['built']} held-out greedy {ws['greedy_accuracy']:.3f} sampled {ws['sampled_accuracy']:.3f}; "
              f"train-pool sampled {ws['train_sampled_accuracy']:.3f}")
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    settings = tiny.settings_of(tiny.read_info(args.model))
    train_rows = synthetic.generate_rows(args.steps * args.prompts, seed=args.seed + 7, split="train", **settings.task_kwargs())
    val_rows = synthetic.generate_rows(512, seed=args.seed + 11, split="val", **settings.task_kwargs())

    def held_out() -> tuple[float, float]:
        model.eval()
        g = tiny.accuracy(model, tok, val_rows, greedy=True, seed=1, max_new_tokens=args.max_new_tokens)
        s = tiny.accuracy(model, tok, val_rows, greedy=False, seed=1, max_new_tokens=args.max_new_tokens)
        return g, s

    g0, s0 = held_out()
    print(f"before: held-out greedy {g0:.3f} sampled {s0:.3f}")
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    torch.manual_seed(args.seed)
    t_start = time.perf_counter()
    rewards_per_step = []
    for step in range(args.steps):
        rows = [r for r in train_rows[step * args.prompts : (step + 1) * args.prompts] for _ in range(args.samples)]
        enc = tiny.encode_prompts(tok, rows)
        plen = enc["input_ids"].shape[1]
        model.eval()
        with torch.no_grad():
            seq = model.generate(**enc, do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0,
                                 max_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id)
        resp = seq[:, plen:]
        # response mask: every token up to and including the first eos
        is_eos = resp == tok.eos_token_id
        after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
        resp_mask = (~after_eos).long()
        texts = tok.batch_decode(resp, skip_special_tokens=True)
        scores = torch.tensor([synthetic.compute_score(r["data_source"], t, r["reward_model"]["ground_truth"])
                               for r, t in zip(rows, texts)])
        group = scores.view(args.prompts, args.samples)
        adv = (group - group.mean(dim=1, keepdim=True)).view(-1)
        model.train()
        attn = torch.cat([enc["attention_mask"], resp_mask], dim=1)
        logits = model(input_ids=seq, attention_mask=attn, position_ids=position_ids_from_mask(attn)).logits
        logits = logits[:, plen - 1 : -1].float() / args.temperature
        logp = torch.log_softmax(logits, -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
        loss = -(adv[:, None] * logp * resp_mask).sum() / resp_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        rewards_per_step.append(scores.mean().item())
        print(f"step {step:3d} reward {scores.mean().item():.3f} loss {loss.item():+.4f} "
              f"t {time.perf_counter() - t_start:5.1f}s", flush=True)
    g1, s1 = held_out()
    k = max(1, min(5, args.steps // 4))
    last = sum(rewards_per_step[-k:]) / k
    print(f"after:  held-out greedy {g1:.3f} sampled {s1:.3f}")
    print(f"train reward: step 0 {rewards_per_step[0]:.3f} -> mean of the last {k} steps {last:.3f} "
          f"({args.steps} steps in {time.perf_counter() - t_start:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
