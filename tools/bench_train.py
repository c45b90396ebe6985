"""Benchmark the PPO trainer: per-phase times, efficiency ratios, and the overhead over a minimal PPO loop.

    .venv/bin/python tools/bench_train.py                 # 1 warm-up + 10 measured steps, ~1 min on 2 cores
    .venv/bin/python tools/bench_train.py --steps 4 --threads 1 --profile

Everything runs in ONE process so that every ratio compares numbers measured side by side (machines here are
shared and noisy; absolute times mean little):

* the real :class:`hpcppo.train.trainer.Trainer` (world size 1, gloo, FSDP2 on one rank, HF rollout engine) on a
  ~0.5M-parameter Qwen2-architecture model built here (random weights, no warm start), 64 prompts x 16 new tokens,
  1 PPO epoch of 4 mini-batches, GAE with a separate critic, a reference (KL in the reward), a checkpoint every step;
* after every trainer step, one iteration of :class:`MinimalPPO` — a hand-written PPO loop on plain Hugging Face
  models (no FSDP, no engine, no metrics file) doing the same forward/backward passes on the same shapes — so the
  two alternate and share the machine's mood;
* micro-benchmarks for the ratios: float32 ``torch.mm`` (matmul peak), a tensor copy of the weight-sync bytes, and a
  write + fsync of a file of the checkpoint's size.

The overhead check: median hpcppo iteration (checkpoint excluded) / median minimal iteration <= 1.20 -> PASS.
Exit status 0 on PASS, 3 on FAIL (1 is a crash). ``--profile`` prints where the trainer's time goes (cProfile
over its steps; it slows the trainer's Python-heavy parts, so read the ratios from a run without it).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import logging
import os
import pstats
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule

OVERHEAD_LIMIT = 1.20
FAIL_EXIT = 3  # the overhead check failed (a crash exits with 1)
PROMPTS = 64
RESPONSE_LEN = 16
MINI_BATCHES = 4


# ---------------------------------------------------------------------------------------------- set-up
def build_model_and_data(root: Path, *, train_rows: int) -> dict[str, Path]:
    """A ~0.5M-parameter Qwen2 model (random, seeded), the tiny character tokenizer, verl-schema prompts.

    The tokenizer goes to its own directory (``model.tokenizer_path``): ``AutoTokenizer`` on a directory whose
    config says ``model_type: qwen2`` substitutes ``Qwen2Tokenizer`` even when ``tokenizer_class`` is pinned in
    tokenizer_config.json, and that drops spaces of the custom vocabulary (checked below).
    """
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from hpcppo.data import synthetic
    from hpcppo.train.tiny import build_tokenizer

    tok = build_tokenizer()
    config = Qwen2Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=512, vocab_size=len(tok), max_position_embeddings=128,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    paths = {"model": root / "model", "tokenizer": root / "tokenizer", "train": root / "data" / "train.parquet"}
    model.save_pretrained(paths["model"])
    tok.save_pretrained(paths["tokenizer"])
    probe = "what is 3 + 4 ?"
    loaded = AutoTokenizer.from_pretrained(str(paths["tokenizer"]))
    if loaded(probe).input_ids != tok(probe).input_ids or loaded.decode(tok(probe).input_ids) != probe:
        raise RuntimeError(f"tokenizer round trip failed: {type(loaded).__name__} encodes {probe!r} differently")
    synthetic.write_split(paths["train"], synthetic.generate_rows(train_rows, seed=0, split="train"))
    return paths


def write_spec(root: Path, paths: dict[str, Path], *, steps: int) -> Path:
    spec = f"""
name = "bench-train"
seed = 1
[model]
path = {json.dumps(str(paths["model"]))}
tokenizer_path = {json.dumps(str(paths["tokenizer"]))}
dtype = "float32"
[data]
train_files = [{json.dumps(str(paths["train"]))}]
max_prompt_length = 32
max_response_length = {RESPONSE_LEN}
truncation = "error"
[rollout]
engine = "hf"
n = 1
temperature = 1.0
micro_batch_size_per_gpu = {PROMPTS}   # one no-grad forward per model for old/ref log-probs and values
[actor]
ppo_epochs = 1
ppo_mini_batch_size = {PROMPTS // MINI_BATCHES}
ppo_micro_batch_size_per_gpu = {PROMPTS // MINI_BATCHES}
[critic]
ppo_micro_batch_size_per_gpu = {PROMPTS // MINI_BATCHES}
[algorithm]
adv_estimator = "gae"
use_kl_in_reward = true
[trainer]
train_batch_size = {PROMPTS}
total_steps = {steps}
test_freq = 0
log_every = 1
collective_timeout_s = 120
[checkpoint]
save_every = 1
keep_last = 2
[resources]
procs_per_node = 1
time = "00:30:00"
"""
    path = root / "bench-train.toml"
    path.write_text(spec)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------- the reference
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


# ---------------------------------------------------------------------------------------------- the trainer, timed
def make_bench_trainer(minimal: MinimalPPO, *, profile: bool, warmup: int):
    """A :class:`Trainer` that, right after each step's metrics row is written, records the iteration's wall time
    and runs one minimal iteration (outside the trainer's window), so the two alternate step by step."""
    from hpcppo.train.trainer import Trainer

    class BenchTrainer(Trainer):
        iter_times: list[float] = []
        min_times: list[float] = []
        shapes: list[tuple[int, int, int]] = []
        profiler = cProfile.Profile() if profile else None

        def train(self) -> int:
            self._mark = time.perf_counter()
            return super().train()

        def rollout(self, timer):
            batch = super().rollout(timer)
            # (samples, prompt+response width, response width): the like-with-like check and the FLOP count
            self.shapes.append((*batch["input_ids"].shape, batch["responses"].shape[1]))
            return batch

        def log_metrics(self, step: int, metrics: dict[str, float], note: str = "") -> None:
            super().log_metrics(step, metrics, note)
            if note:
                return
            # The whole step as the loop runs it (control check of the previous step .. this metrics row), minus
            # the checkpoint: excluded from the comparison (the minimal loop saves nothing).
            self.iter_times.append(time.perf_counter() - self._mark - metrics.get("time/checkpoint_s", 0.0))
            if self.profiler is not None:
                self.profiler.disable()
            t0 = time.perf_counter()
            minimal.iteration()
            self.min_times.append(time.perf_counter() - t0)
            if self.profiler is not None and step >= warmup:
                self.profiler.enable()
            self._mark = time.perf_counter()

    return BenchTrainer


# ---------------------------------------------------------------------------------------------- micro-benchmarks
def best_time(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def matmul_peak(n: int = 1024) -> float:
    """FLOP/s of a float32 n x n matmul on the current threads (best of several)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    return 2 * n**3 / best_time(lambda: torch.mm(a, b, out=out), 5)


def copy_rate(nbytes: int) -> float:
    """Bytes/s of a plain tensor copy of ``nbytes`` (median of many: the buffer is small)."""
    src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    dst.copy_(src)
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times)


def file_write_rate(directory: Path, nbytes: int) -> float:
    """Bytes/s of writing ``nbytes`` to a new file + fsync (median of 5), in the run's directory."""
    data = os.urandom(nbytes)
    times = []
    for i in range(5):
        path = directory / f"write-probe-{i}.bin"
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        times.append(time.perf_counter() - t0)
        path.unlink()
    return nbytes / statistics.median(times)


def update_breakdown(models: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]], rows: int, width: int,
                     vocab: int, reps: int = 6) -> dict[str, dict[str, float]]:
    """Median ms of the pieces of one actor mini-batch update (forward to log-probs, backward, grad clip, AdamW
    step) for each (model, optimizer), alternating between them; random token ids, the same for all. Run after
    training (it moves the weights)."""
    from hpcppo.train.models import forward_log_probs

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, width), generator=g)
    att, pos = torch.ones_like(ids), torch.arange(width).expand(rows, width)
    times: dict[str, dict[str, list[float]]] = {k: {} for k in models}
    for rep in range(reps + 1):
        for name, (model, opt) in models.items():
            marks = [time.perf_counter()]
            lp, _ = forward_log_probs(model, ids, att, pos, RESPONSE_LEN)
            loss = lp.mean()
            marks.append(time.perf_counter())
            loss.backward()
            marks.append(time.perf_counter())
            norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], 1.0)
            float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
            marks.append(time.perf_counter())
            opt.step()
            opt.zero_grad(set_to_none=True)
            marks.append(time.perf_counter())
            if rep:  # the first round warms up
                for part, a, b in zip(("forward", "backward", "clip", "optim_step"), marks, marks[1:]):
                    times[name].setdefault(part, []).append(b - a)
    return {name: {part: 1e3 * statistics.median(v) for part, v in parts.items()} for name, parts in times.items()}


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights once; DTensors report the global size


# ---------------------------------------------------------------------------------------------- the report
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


# ---------------------------------------------------------------------------------------------- main
def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Build, train with the minimal loop interleaved, measure the reference rates; returns the figures."""
    from hpcppo.config import compile_config
    from hpcppo.dist import env as dist_env
    from hpcppo.metrics import load as load_metrics
    from hpcppo.train.build import build_components

    paths = build_model_and_data(root, train_rows=512)
    compiled = compile_config(write_spec(root, paths, steps=args.warmup + args.steps), "local", check_paths=False)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    env = dist_env.detect_env(device_type="cpu")
    if env.world_size != 1:
        raise SystemExit(f"run this benchmark as a single process (found world size {env.world_size})")
    dist_env.init_distributed(env, timeout_s=120)
    try:
        run_dir = root / "run"
        (run_dir / "control").mkdir(parents=True, exist_ok=True)
        comps = build_components(compiled, env, run_dir)
        torch.set_num_threads(args.threads)
        minimal = MinimalPPO(paths, compiled.experiment)
        trainer = make_bench_trainer(minimal, profile=args.profile, warmup=args.warmup)(comps)
        try:
            code = trainer.train()
        finally:
            trainer.close()
        if code != 0:
            raise SystemExit(f"the trainer returned exit code {code}")
        df = load_metrics(run_dir)
        sync_bytes = sum(p.numel() * p.element_size() for p in comps.actor.parameters())
        ckpt_bytes = dir_bytes(comps.ckpt.step_dir(comps.ckpt.latest_committed()))
        samples, width, _ = trainer.shapes[-1]
        breakdown = update_breakdown({"hpcppo actor (as built)": (comps.actor, comps.actor_optim),
                                      "plain HF actor": (minimal.actor, minimal.actor_opt)},
                                     samples // MINI_BATCHES, width, len(minimal.tok))
        results = figures(args.warmup, trainer, minimal, df[df["step"] > args.warmup],
                          actor_n=n_params(comps.actor), critic_n=n_params(comps.critic), sync_bytes=sync_bytes,
                          ckpt_bytes=ckpt_bytes, peak=matmul_peak(), copy_bps=copy_rate(sync_bytes),
                          write_bps=file_write_rate(run_dir, ckpt_bytes), breakdown=breakdown,
                          fsdp=isinstance(comps.actor, FSDPModule))
    finally:
        dist_env.destroy_distributed()
    print_phases(results, args.steps, args.warmup)
    print_ratios(results)
    if trainer.profiler is not None:
        print_profile(trainer.profiler)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="measured steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=1, help="steps left out of the medians")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="torch threads for everything (default: all cores, as a 1-rank trainer uses)")
    ap.add_argument("--profile", action="store_true", help="cProfile the trainer's measured steps")
    ap.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    ap.add_argument("--keep", type=Path, help="work in this directory and keep it (default: a temporary one)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        ap.error("--steps and --threads must be >= 1, --warmup >= 0")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the trainer's thread policy yields to it
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    t0 = time.perf_counter()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        results = run(args, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
            results = run(args, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"total benchmark wall time: {time.perf_counter() - t0:.1f} s")
    return 0 if results["pass"] else FAIL_EXIT


if __name__ == "__main__":
    sys.exit(main())
