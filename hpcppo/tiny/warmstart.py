"""The two supervised warm-start stages that turn a random tiny model into a flawed SFT model.

``warm_start`` teaches the task (teacher forcing, loss on the answer tokens only); ``add_flaw`` then
teaches a habit that costs reward (a stray digit after the answer). PPO thus starts, as RLHF starts
from an SFT model, from a policy that knows the answers, succeeds only sometimes, and can be fixed
quickly.

Why each stage runs a fixed schedule to convergence (warmup, then cosine decay to zero) rather than
stopping when an accuracy first crosses a target: the trajectory of a 0.5M model trained at a high
learning rate is chaotic. CPU kernels differ between machines (AVX-512, AVX2 or scalar, each with
its own order of float additions; one thread does not make them agree), the last-bit differences
grow within a few dozen steps, and held-out accuracy (40 distinct problems) swings by 0.2 between
two evaluations. A stopping rule then picks a different model on each machine, and the flaw stage
stopped by "sampled accuracy <= target" used to stop early *because* its first Adam steps broke the
arithmetic (greedy accuracy 1.0 -> 0.3 in two steps), not because the habit was learnt. A converged
stage ends near the same function on every machine: greedy accuracy near 1 after stage 1, and after
stage 2 a stop probability after the answer near ``1 - flaw_rate``, i.e. sampled accuracy near 0.25
with greedy decoding still stopping in time (over three kernel sets x three seeds: sampled 0.25-0.33,
greedy 0.88-1.0). The targets are checked, not chased.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any

from hpcppo.data import synthetic
from hpcppo.tiny.model import accuracy
from hpcppo.tiny.settings import TinySettings
from hpcppo.tiny.tokenizer import supervised_batch

if TYPE_CHECKING:
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast


def warm_start(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, settings: TinySettings) -> dict[str, Any]:
    """Stage 1: ``settings.steps`` supervised steps on training-pool rows, lr warmed up then decayed to zero.

    Returns ``{"steps", "reached_target", "history": [{"step", "loss", "greedy_accuracy"}]}``;
    ``reached_target``: the final greedy held-out accuracy is >= ``target_greedy_accuracy``.
    """
    n, bs = settings.steps, settings.batch_size
    rows = synthetic.generate_rows(n * bs, seed=settings.seed, split="train", **settings.task_kwargs())
    eval_rows = _eval_rows(settings)
    opt, sched = _optimizer(model, settings.lr, settings.warmup_steps, n)
    history: list[dict[str, float]] = []
    for step in range(1, n + 1):
        loss = _sft_step(model, opt, supervised_batch(tokenizer, rows[(step - 1) * bs : step * bs]))
        sched.step()
        if step % settings.eval_every == 0 or step == n:
            acc = accuracy(model, tokenizer, eval_rows, greedy=True, seed=0, max_new_tokens=settings.max_new_tokens)
            history.append({"step": step, "loss": loss, "greedy_accuracy": acc})
    model.eval()
    return {"steps": n, "reached_target": history[-1]["greedy_accuracy"] >= settings.target_greedy_accuracy,
            "history": history}


def ramble_targets(rows: list[dict[str, Any]], rate: float, *, seed: int) -> list[str]:
    """Ground truths, a fraction ``rate`` of them with one random digit appended ("19" -> "193")."""
    rng = random.Random(f"hpcppo-tiny-ramble:{seed}")
    return [row["reward_model"]["ground_truth"] + (str(rng.randrange(10)) if rng.random() < rate else "") for row in rows]


def add_flaw(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, settings: TinySettings) -> dict[str, Any]:
    """Stage 2: ``settings.flaw_steps`` steps on answers of which ``flaw_rate`` ramble on with a stray digit.

    Why: after stage 1 a tiny model is either wrong or confidently right (its sampled and greedy
    accuracies are close), so RL would have to teach arithmetic itself -- too slow for a demo.
    Fine-tuned to convergence on answers of which ``flaw_rate`` carry a stray digit after them, the
    model keeps its arithmetic and appends a digit with probability about ``flaw_rate`` when sampled
    at temperature 1 (a wrong answer), while greedy decoding still stops in time: the end token (about
    ``1 - flaw_rate``) stays likelier than any one of the ten digits. That is where RLHF starts -- a
    capable SFT model with a systematic flaw -- and a short RL run fixes it. The first steps of a fresh
    Adam shake the arithmetic (greedy accuracy dips), hence the warmup and the decay: the stage ends
    once it has recovered. (Stray digits mixed into stage 1 were tried: they slowed the arithmetic
    badly. So was scaling the logits down: RL then has to sharpen every decision and gained far less.)
    Returns ``{"steps", "reached_target", "history": [{"step", "greedy_accuracy", "sampled_accuracy"}]}``;
    ``reached_target``: the final sampled held-out accuracy is <= ``target_sampled_accuracy``.
    """
    n, bs = settings.flaw_steps, settings.batch_size
    rows = synthetic.generate_rows(n * bs, seed=settings.seed + 3_000_017, split="train", **settings.task_kwargs())
    targets = ramble_targets(rows, settings.flaw_rate, seed=settings.seed)
    eval_rows = _eval_rows(settings)
    opt, sched = _optimizer(model, settings.flaw_lr, settings.flaw_warmup_steps, n)
    history: list[dict[str, float]] = []
    for step in range(n + 1):
        if step % settings.eval_every == 0 or step == n:
            kw = {"max_new_tokens": settings.max_new_tokens}
            greedy = accuracy(model, tokenizer, eval_rows, greedy=True, seed=0, **kw)
            sampled = accuracy(model, tokenizer, eval_rows, greedy=False, seed=settings.seed + step, **kw)
            history.append({"step": step, "greedy_accuracy": greedy, "sampled_accuracy": sampled})
        if step == n:
            break
        lo, hi = step * bs, (step + 1) * bs
        _sft_step(model, opt, supervised_batch(tokenizer, rows[lo:hi], targets[lo:hi]))
        sched.step()
    model.eval()
    return {"steps": n, "reached_target": history[-1]["sampled_accuracy"] <= settings.target_sampled_accuracy,
            "history": history}


def _optimizer(model: LlamaForCausalLM, lr: float, warmup: int, total: int) -> tuple[Any, Any]:
    """AdamW whose lr rises linearly over ``warmup`` steps, then follows a cosine down to zero at ``total``."""
    import torch

    def scale(k: int) -> float:  # k: steps taken so far
        if k < warmup:
            return (k + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * (k - warmup) / max(1, total - warmup)))

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, scale)


def _sft_step(model: LlamaForCausalLM, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> float:
    import torch

    model.train()
    loss = model(**batch).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def _eval_rows(settings: TinySettings) -> list[dict[str, Any]]:
    # Held-out problems; the seed offset keeps these draws apart from the val.parquet rows.
    return synthetic.generate_rows(settings.eval_size, seed=settings.seed + 1_000_003, split="val", **settings.task_kwargs())
