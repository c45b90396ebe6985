"""The reference of tools/bench_train.py: a minimal PPO iteration written inline on plain Hugging Face models.

A helper module of the benchmark script (tools/ is not a package: the script's directory is on sys.path).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import torch
from _bench_train_workload import MINI_BATCHES, PROMPTS, RESPONSE_LEN


class MinimalPPO:
    """A minimal PPO iteration, written inline: plain HF actor/reference/critic, a KV-cached sampling loop, KL in
    the reward, GAE, clipped losses, AdamW. The reference against which the framework's overhead is measured."""

    def __init__(self, paths: dict[str, Path], cfg: Any):
        from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, PreTrainedTokenizerFast

        from hpcppo.data import synthetic

        self.cfg = cfg
        self.tok = tok = PreTrainedTokenizerFast.from_pretrained(str(paths["tokenizer"]))
        model, f32 = str(paths["model"]), torch.float32
        self.actor = AutoModelForCausalLM.from_pretrained(model, dtype=f32).train()
        self.ref = AutoModelForCausalLM.from_pretrained(model, dtype=f32).eval().requires_grad_(False)
        self.critic = AutoModelForTokenClassification.from_pretrained(model, num_labels=1, dtype=f32).train()
        a, c = cfg.actor, cfg.critic
        self.actor_opt = torch.optim.AdamW(self.actor.parameters(), lr=a.lr, weight_decay=a.weight_decay, betas=a.betas)
        self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=c.lr, weight_decay=c.weight_decay,
                                            betas=c.betas)
        self.rows = synthetic.generate_rows(512, seed=1, split="train")
        texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in self.rows]
        self.prompt_ids = [tok(text, add_special_tokens=False).input_ids for text in texts]
        self.score = synthetic.compute_score
        self.gen = torch.Generator().manual_seed(0)
        self.it = 0
        self.phases: dict[str, list[float]] = {}
        self.widths: list[int] = []
        self.last_width = 0

    @contextlib.contextmanager
    def timed(self, phase: str):
        t0 = time.perf_counter()
        yield
        self.phases.setdefault(phase, []).append(time.perf_counter() - t0)

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """KV-cached sampling of ``RESPONSE_LEN`` tokens; a row stops at EOS. ``[B, P]`` -> ``[B, R]`` tokens, mask."""
        pad, eos = self.tok.pad_token_id, self.tok.eos_token_id
        x, pos, att, cache = ids, (mask.cumsum(-1) - 1).clamp(min=0), mask, None
        done, toks, alive = torch.zeros(ids.shape[0], dtype=torch.bool), [], []
        for _ in range(RESPONSE_LEN):
            out = self.actor(input_ids=x, attention_mask=att, position_ids=pos, cache=cache, use_cache=True,
                             logits_to_keep=1)
            cache = out.past_key_values
            nxt = torch.multinomial(out.logits[:, -1].float().softmax(-1), 1, generator=self.gen).squeeze(-1)
            nxt = torch.where(done, pad, nxt)
            toks.append(nxt), alive.append(~done)
            done = done | (nxt == eos)
            x, pos, att = nxt[:, None], pos[:, -1:] + 1, torch.cat([att, torch.ones_like(att[:, :1])], 1)
        return torch.stack(toks, 1), torch.stack(alive, 1).float()

    def advantages(self, scores, old, ref, values, rmask) -> tuple[torch.Tensor, torch.Tensor]:
        """KL-penalised token rewards (score on the last token), GAE, whitened advantages. All ``[B, R]``."""
        alg, (b, r) = self.cfg.algorithm, rmask.shape
        rewards = torch.zeros_like(rmask)
        rewards[torch.arange(b), (rmask.sum(-1) - 1).clamp(min=0).long()] = scores
        rewards = (rewards - alg.kl_ctrl.kl_coef * (old - ref)) * rmask
        adv, gae = torch.zeros_like(rewards), torch.zeros(b)
        for k in reversed(range(r)):
            next_value = values[:, k + 1] if k + 1 < r else torch.zeros(b)
            gae = rewards[:, k] + alg.gamma * next_value - values[:, k] + alg.gamma * alg.lam * gae
            adv[:, k] = gae
        mean = (adv * rmask).sum() / rmask.sum()
        var = (((adv - mean) * rmask) ** 2).sum() / rmask.sum()
        return (adv - mean) * torch.rsqrt(var + 1e-8) * rmask, adv + values

    def iteration(self) -> None:
        cfg, R, pad = self.cfg, RESPONSE_LEN, self.tok.pad_token_id
        pick = [(self.it * PROMPTS + i) % len(self.rows) for i in range(PROMPTS)]
        self.it += 1
        width = max(len(self.prompt_ids[i]) for i in pick)
        ids = torch.tensor([[pad] * (width - len(self.prompt_ids[i])) + self.prompt_ids[i] for i in pick])
        mask = (ids != pad).long()  # left padding; the pad id never occurs inside a prompt
        with self.timed("generate"):
            resp, rmask = self.generate(ids, mask)
        seq, att = torch.cat([ids, resp], 1), torch.cat([mask, rmask.long()], 1)
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        self.widths.append(resp.shape[1])
        self.last_width = seq.shape[1]
        with self.timed("reward"):
            texts = self.tok.batch_decode(resp * rmask.long(), skip_special_tokens=True)
            rows = [self.rows[i] for i in pick]
            scores = torch.tensor([self.score(r["data_source"], s, r["reward_model"]["ground_truth"])
                                   for r, s in zip(rows, texts)])

        def logp(model, sl):  # log-probs of the response tokens [b, R]
            logits = model(input_ids=seq[sl], attention_mask=att[sl], position_ids=pos[sl],
                           logits_to_keep=R + 1).logits[:, :-1].float()
            return logits.log_softmax(-1).gather(-1, seq[sl, -R:, None]).squeeze(-1)

        def values(sl):  # V of the state before each response token [b, R]
            out = self.critic(input_ids=seq[sl], attention_mask=att[sl], position_ids=pos[sl])
            return out.logits[:, -R - 1:-1, 0]

        every = slice(None)
        with torch.no_grad():
            with self.timed("old_logprob"):
                old = logp(self.actor, every)
            with self.timed("ref"):
                ref = logp(self.ref, every)
            with self.timed("values"):
                v_old = values(every) * rmask
        with self.timed("adv"):
            adv, ret = self.advantages(scores, old, ref, v_old, rmask)
        size = PROMPTS // MINI_BATCHES
        minis = [slice(i, i + size) for i in range(0, PROMPTS, size)]
        with self.timed("critic_update"):
            clip = cfg.critic.cliprange_value
            for mb in minis:
                v = values(mb)
                vc = v_old[mb] + (v - v_old[mb]).clamp(-clip, clip)
                loss = torch.maximum((v - ret[mb]) ** 2, (vc - ret[mb]) ** 2)
                (0.5 * (loss * rmask[mb]).sum() / rmask[mb].sum()).backward()
                torch.nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.critic.grad_clip)
                self.critic_opt.step()
                self.critic_opt.zero_grad(set_to_none=True)
        with self.timed("actor_update"):
            eps = cfg.actor.clip_ratio
            for mb in minis:
                ratio = torch.exp(logp(self.actor, mb) - old[mb])
                pg = torch.maximum(-adv[mb] * ratio, -adv[mb] * ratio.clamp(1 - eps, 1 + eps))
                ((pg * rmask[mb]).sum() / rmask[mb].sum()).backward()
                torch.nn.utils.clip_grad_norm_(self.actor.parameters(), cfg.actor.grad_clip)
                self.actor_opt.step()
                self.actor_opt.zero_grad(set_to_none=True)
