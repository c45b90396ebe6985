"""A cleanrl-style PPO iteration for LLMs in one file: the reference loop of tools/bench_peers.py (issue 11).

It makes exactly the passes hpcppo's Trainer makes, on plain Hugging Face models, with nothing around them:

  generate  KV-cached sampling of 16 tokens for 64 prompts (one batched forward per token)
  reward    the rule score of each decoded response (workload.score_text)
  old_logprob  one no-grad forward of the actor over the 64 x 21 sequences
  ref       one no-grad forward of the reference
  values    one no-grad forward of the critic
  adv       k1 KL in the reward at 0.05, GAE (gamma 1, lambda 0.95), whitened advantages
  critic_update  4 mini-batches of 16: forward, clipped value loss, backward, clip, AdamW
  actor_update   4 mini-batches of 16: forward, clipped policy loss, backward, clip, AdamW

No stop token: every row has 16 response tokens (hpcppo masks a row after an EOS it samples; the forwards have the
same shapes either way). Importable in hpcppo's venv or run alone: ``python tools/peers/cleanrl_ppo.py --iters 3``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workload as W  # noqa: E402


class CleanRLPPO:
    def __init__(self, paths: dict[str, Path], *, seed: int = 0):
        from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, PreTrainedTokenizerFast

        self.tok = PreTrainedTokenizerFast.from_pretrained(str(paths["tokenizer"]))
        f32 = torch.float32
        self.actor = AutoModelForCausalLM.from_pretrained(str(paths["model"]), dtype=f32).train()
        self.ref = AutoModelForCausalLM.from_pretrained(str(paths["model"]), dtype=f32).eval().requires_grad_(False)
        self.critic = AutoModelForTokenClassification.from_pretrained(str(paths["model"]), num_labels=1,
                                                                      dtype=f32).train()
        self.actor_opt = torch.optim.AdamW(self.actor.parameters(), lr=W.LR)
        self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=W.LR)
        self.prompts = torch.tensor(json.loads(Path(paths["prompt_ids"]).read_text()))
        self.gen = torch.Generator().manual_seed(seed)
        self.phases: dict[str, list[float]] = {}
        self.iter_times: list[float] = []

    @contextlib.contextmanager
    def timed(self, phase: str):
        t0 = time.perf_counter()
        yield
        self.phases.setdefault(phase, []).append(time.perf_counter() - t0)

    @torch.no_grad()
    def generate(self, ids: torch.Tensor) -> torch.Tensor:
        x, cache, out = ids, None, []
        pos = torch.arange(ids.shape[1]).expand_as(ids)
        for _ in range(W.RESPONSE_LEN):
            o = self.actor(input_ids=x, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1)
            cache = o.past_key_values
            nxt = torch.multinomial(o.logits[:, -1].float().softmax(-1), 1, generator=self.gen)
            out.append(nxt)
            x, pos = nxt, pos[:, -1:] + 1
        return torch.cat(out, 1)

    def logp(self, model, seq: torch.Tensor) -> torch.Tensor:  # [b, R] log-probs of the response tokens
        logits = model(input_ids=seq, logits_to_keep=W.RESPONSE_LEN + 1).logits[:, :-1].float()
        return logits.log_softmax(-1).gather(-1, seq[:, -W.RESPONSE_LEN:, None]).squeeze(-1)

    def values(self, seq: torch.Tensor) -> torch.Tensor:  # [b, R] V of the state before each response token
        return self.critic(input_ids=seq).logits[:, -W.RESPONSE_LEN - 1:-1, 0]

    def iteration(self) -> None:
        t_iter = time.perf_counter()
        ids = self.prompts
        with self.timed("generate"):
            resp = self.generate(ids)
        seq = torch.cat([ids, resp], 1)
        with self.timed("reward"):
            texts = self.tok.batch_decode(resp, skip_special_tokens=True)
            scores = torch.tensor([W.score_text("bench_peers", t, "") for t in texts])
        with torch.no_grad():
            with self.timed("old_logprob"):
                old = self.logp(self.actor, seq)
            with self.timed("ref"):
                ref = self.logp(self.ref, seq)
            with self.timed("values"):
                v_old = self.values(seq)
        with self.timed("adv"):
            rewards = -W.KL_COEF * (old - ref)  # k1
            rewards[:, -1] += scores
            adv, gae = torch.zeros_like(rewards), torch.zeros(rewards.shape[0])
            for k in reversed(range(W.RESPONSE_LEN)):
                nv = v_old[:, k + 1] if k + 1 < W.RESPONSE_LEN else torch.zeros_like(gae)
                gae = rewards[:, k] + W.GAMMA * nv - v_old[:, k] + W.GAMMA * W.LAM * gae
                adv[:, k] = gae
            ret = adv + v_old
            adv = (adv - adv.mean()) * torch.rsqrt(adv.var() + 1e-8)
        size = W.PROMPTS // W.MINI_BATCHES
        minis = [slice(i, i + size) for i in range(0, W.PROMPTS, size)]
        with self.timed("critic_update"):
            for _ in range(W.EPOCHS):
                for mb in minis:
                    v = self.values(seq[mb])
                    vc = v_old[mb] + (v - v_old[mb]).clamp(-W.VALUE_CLIP, W.VALUE_CLIP)
                    (0.5 * torch.maximum((v - ret[mb]) ** 2, (vc - ret[mb]) ** 2).mean()).backward()
                    torch.nn.utils.clip_grad_norm_(self.critic.parameters(), 1.0)
                    self.critic_opt.step()
                    self.critic_opt.zero_grad(set_to_none=True)
        with self.timed("actor_update"):
            for _ in range(W.EPOCHS):
                for mb in minis:
                    ratio = torch.exp(self.logp(self.actor, seq[mb]) - old[mb])
                    pg = torch.maximum(-adv[mb] * ratio, -adv[mb] * ratio.clamp(1 - W.CLIP, 1 + W.CLIP))
                    pg.mean().backward()
                    torch.nn.utils.clip_grad_norm_(self.actor.parameters(), 1.0)
                    self.actor_opt.step()
                    self.actor_opt.zero_grad(set_to_none=True)
        self.iter_times.append(time.perf_counter() - t_iter)


def main() -> int:
    import tempfile

    ap = argparse.ArgumentParser(description="run the cleanrl-style loop alone")
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        loop = CleanRLPPO(W.build(Path(tmp)))
        for _ in range(args.iters):
            loop.iteration()
        print({k: round(sorted(v)[len(v) // 2], 4) for k, v in loop.phases.items()},
              [round(t, 3) for t in loop.iter_times])
    return 0


if __name__ == "__main__":
    sys.exit(main())
