"""The two supervised warm-start stages that turn a random tiny model into a flawed SFT model.

``warm_start`` teaches the task (teacher forcing, loss on the answer tokens only) until greedy
held-out accuracy reaches a target; ``add_flaw`` then teaches a habit that costs reward (a stray
digit after the answer) until the accuracy of sampling at temperature 1 falls to a target. PPO thus
starts, as RLHF starts from an SFT model, from a policy that knows most answers, succeeds only
sometimes, and can be fixed quickly.
"""

from __future__ import annotations

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
    """Stage 1: supervised steps on training-pool rows until greedy held-out accuracy reaches its target.

    Returns ``{"steps", "reached_target", "history": [{"step", "loss", "greedy_accuracy"}]}``.
    """
    import torch

    rows = synthetic.generate_rows(
        settings.max_steps * settings.batch_size, seed=settings.seed, split="train", **settings.task_kwargs()
    )
    eval_rows = _eval_rows(settings)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
    history: list[dict[str, float]] = []
    step, reached = 0, False
    while step < settings.max_steps:
        batch = supervised_batch(tokenizer, rows[step * settings.batch_size : (step + 1) * settings.batch_size])
        loss = _sft_step(model, opt, batch)
        step += 1
        if step % settings.eval_every == 0:
            acc = accuracy(model, tokenizer, eval_rows, greedy=True, seed=0, max_new_tokens=settings.max_new_tokens)
            history.append({"step": step, "loss": loss, "greedy_accuracy": acc})
            if acc >= settings.target_greedy_accuracy:
                reached = True
                break
    model.eval()
    return {"steps": step, "reached_target": reached, "history": history}


def ramble_targets(rows: list[dict[str, Any]], rate: float, *, seed: int) -> list[str]:
    """Ground truths, a fraction ``rate`` of them with one random digit appended ("19" -> "193")."""
    rng = random.Random(f"hpcppo-tiny-ramble:{seed}")
    return [row["reward_model"]["ground_truth"] + (str(rng.randrange(10)) if rng.random() < rate else "") for row in rows]


def add_flaw(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, settings: TinySettings) -> dict[str, Any]:
    """Stage 2: teach a habit of rambling on after the answer until sampled held-out accuracy <= target.

    Why: after stage 1 a tiny model is either wrong or confidently right (its sampled and greedy
    accuracies are close), so RL would have to teach arithmetic itself -- too slow for a demo.
    Fine-tuned on answers of which ``flaw_rate`` carry a stray digit after them, the model keeps
    its arithmetic and often appends a digit when sampled at temperature 1 (a wrong answer), while
    greedy decoding still mostly stops in time (the end token stays the likeliest continuation).
    That is where RLHF starts -- a capable SFT model with a systematic flaw -- and a short RL run
    fixes it. (Stray digits mixed into stage 1 were tried: they slowed the arithmetic badly. So was
    scaling the logits down: RL then has to sharpen every decision and gained far less.)
    Returns ``{"steps", "reached_target", "history": [{"step", "sampled_accuracy"}]}``.
    """
    import torch

    rows = synthetic.generate_rows(
        settings.flaw_max_steps * settings.batch_size, seed=settings.seed + 3_000_017, split="train", **settings.task_kwargs()
    )
    targets = ramble_targets(rows, settings.flaw_rate, seed=settings.seed)
    eval_rows = _eval_rows(settings)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.flaw_lr, weight_decay=0.0)
    history: list[dict[str, float]] = []
    step, reached = 0, False
    while True:
        acc = accuracy(model, tokenizer, eval_rows, greedy=False, seed=settings.seed + step, max_new_tokens=settings.max_new_tokens)
        history.append({"step": step, "sampled_accuracy": acc})
        if acc <= settings.target_sampled_accuracy:
            reached = True
            break
        if step == settings.flaw_max_steps:
            break
        lo, hi = step * settings.batch_size, (step + 1) * settings.batch_size
        _sft_step(model, opt, supervised_batch(tokenizer, rows[lo:hi], targets[lo:hi]))
        step += 1
    model.eval()
    return {"steps": step, "reached_target": reached, "history": history}


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
