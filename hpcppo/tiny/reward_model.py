"""A tiny reward model for the arithmetic task: the tiny actor's tokenizer and architecture with a one-label
``score`` head (``LlamaForSequenceClassification``), regressed for a few seconds on CPU onto the arith rule's score.

What it learns from: for arithmetic problems of the training pool, responses of the three kinds the tiny actor
produces: the right answer, the right answer followed by a stray digit (the flaw the actor's warm start teaches,
which the rule scores 0), and a wrong number; each labelled with ``hpcppo.data.synthetic.compute_score`` (1 or 0).
Each is read exactly as the trainer reads a response (``hpcppo.data.rm_inputs``: the chat template with the answer
as the assistant's turn, the last token's score), with a mean-squared error, so its score approximates the rule's
reward and an arith run with ``[reward_model]`` learns what the rule-based run learns. ``hpcppo_tiny_rm.json``
records the agreement with the rule on held-out problems (score > 0.5 against the rule's 1). Like the actor's
build: one thread, seeded, idempotent on its settings.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcppo.data import synthetic
from hpcppo.data.rm_inputs import reward_model_text
from hpcppo.errors import PathError
from hpcppo.fsutil import require_output_dir
from hpcppo.tiny.make import save_model_dir
from hpcppo.tiny.settings import TinySettings
from hpcppo.tiny.tokenizer import build_tokenizer

if TYPE_CHECKING:
    import torch
    from transformers import LlamaForSequenceClassification, PreTrainedTokenizerFast

RM_INFO_FILE = "hpcppo_tiny_rm.json"
RM_STEPS = 300
RM_BATCH = 64
RM_LR = 3e-3


def _responses(rows: list[dict[str, Any]], rng: random.Random) -> list[tuple[dict[str, Any], str, float]]:
    """(row, response, rule score): a third right answers, a third with a stray digit, a third wrong numbers."""
    out = []
    for row in rows:
        answer = int(row["reward_model"]["ground_truth"])
        kind = rng.randrange(3)
        text = str(answer) if kind == 0 else f"{answer}{rng.randrange(10)}" if kind == 1 else \
            str(answer + rng.choice([-1, 1]) * rng.randint(1, 20))
        score = synthetic.compute_score(synthetic.DATA_SOURCE, text, row["reward_model"]["ground_truth"])
        out.append((row, text, score))
    return out


def _batch(tokenizer: PreTrainedTokenizerFast,
           samples: list[tuple[dict[str, Any], str, float]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    import torch

    texts = [reward_model_text(tokenizer, row["prompt"], text) for row, text, _ in samples]
    enc = tokenizer(texts, add_special_tokens=False, padding=True, padding_side="right", return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"], torch.tensor([s for _, _, s in samples])


def _scores(model: LlamaForSequenceClassification, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The last valid token's score, as the trainer reads it (hpcppo.models.reward_model)."""
    import torch

    hidden = model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    last = mask.sum(-1) - 1
    return model.score(hidden[torch.arange(ids.shape[0]), last]).squeeze(-1)


def _train(model: LlamaForSequenceClassification, tokenizer: PreTrainedTokenizerFast,
           settings: TinySettings) -> list[float]:
    import torch

    rows = synthetic.generate_rows(RM_STEPS * RM_BATCH // 4, seed=settings.seed + 7_000_001, split="train",
                                   **settings.task_kwargs())
    rng = random.Random(settings.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=RM_LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / 30) * (1 - k / RM_STEPS))
    losses = []
    model.train()
    for step in range(RM_STEPS):
        ids, mask, target = _batch(tokenizer, _responses(rng.sample(rows, RM_BATCH), rng))
        loss = torch.nn.functional.mse_loss(_scores(model, ids, mask), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    return losses


def _agreement(model: LlamaForSequenceClassification, tokenizer: PreTrainedTokenizerFast,
               settings: TinySettings) -> dict[str, float]:
    import torch

    rows = synthetic.generate_rows(300, seed=settings.seed + 9_000_011, split="val", **settings.task_kwargs())
    ids, mask, target = _batch(tokenizer, _responses(rows, random.Random(settings.seed + 1)))
    model.eval()
    with torch.no_grad():
        scores = _scores(model, ids, mask)
    right = target > 0.5
    return {"agreement": float(((scores > 0.5) == right).float().mean()),
            "score_mean_right": float(scores[right].mean()), "score_mean_wrong": float(scores[~right].mean())}


def build_tiny_reward_model(out_dir: str | os.PathLike[str], *, seed: int = 0, force: bool = False,
                            **overrides: Any) -> dict[str, Any]:
    """Build (or find up to date) the tiny reward model in ``out_dir``; returns its ``hpcppo_tiny_rm.json`` record
    plus ``"built"``. ``overrides`` are task settings (``TinySettings`` fields, as for the actor)."""
    settings = TinySettings(seed=seed, **overrides)
    out = require_output_dir(out_dir, "--reward-out")
    digest = f"{settings.digest()}:rm:{RM_STEPS}:{RM_BATCH}:{RM_LR}"
    info_path = out / RM_INFO_FILE
    if out.exists() and not info_path.is_file() and any(out.iterdir()):
        raise PathError(f"--reward-out {out} exists and is not a tiny reward-model build (no {RM_INFO_FILE})")
    if not force and info_path.is_file():
        info = json.loads(info_path.read_text())
        if info.get("settings_hash") == digest:
            return {**info, "built": False}  # without importing torch: the CLI stays instant when up to date
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokenizer = build_tokenizer()
        config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=settings.hidden_size,
                             intermediate_size=settings.intermediate_size, num_hidden_layers=settings.num_layers,
                             num_attention_heads=settings.num_heads, num_key_value_heads=settings.num_kv_heads,
                             max_position_embeddings=settings.max_position_embeddings,
                             bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
        config.num_labels = 1  # one score (a PretrainedConfig property: it sets id2label)
        with torch.random.fork_rng():
            torch.manual_seed(settings.seed + 11)
            model = LlamaForSequenceClassification(config)
            losses = _train(model, tokenizer, settings)
        measured = _agreement(model, tokenizer, settings)
    finally:
        torch.set_num_threads(threads)
    info = {"settings_hash": digest, "architecture": "LlamaForSequenceClassification",
            "num_parameters": sum(p.numel() for p in model.parameters()), "steps": RM_STEPS,
            "final_loss": round(sum(losses[-20:]) / 20, 4), "held_out": measured,
            "build_seconds": round(time.perf_counter() - t0, 2)}
    _save(model, tokenizer, info, out)
    return {**info, "built": True}


def _save(model: Any, tokenizer: Any, info: dict[str, Any], out: Path) -> None:
    save_model_dir(model, tokenizer, out, RM_INFO_FILE, json.dumps(info, indent=2, sort_keys=True) + "\n")