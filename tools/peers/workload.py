"""The one workload of tools/bench_peers.py, shared by hpcppo, TRL and the cleanrl-style loop (issue 11).

Qwen2: hidden 128, 2 layers, 4 heads, 2 KV heads, intermediate 256, vocab 64 (hpcppo's tiny tokenizer), untied
embeddings, float32, random weights (seed 0). 64 prompts of exactly 5 tokens (``<bos> <|user|> c c <|assistant|>``,
two characters of content); 16 new tokens at temperature 1; 1 PPO epoch of 4 mini-batches of 16; GAE gamma 1,
lambda 0.95; clip 0.2, value clip 0.2; k1 KL in the reward at 0.05. The score is a rule on the response text
(:func:`score_text`: the fraction of its characters that are digits).

This module imports only torch, transformers and the standard library at the top (TRL's venv has no hpcppo), plus
hpcppo inside :func:`build` (run in hpcppo's venv only).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

PROMPTS = 64
PROMPT_LEN = 5
RESPONSE_LEN = 16
MINI_BATCHES = 4
EPOCHS = 1
GAMMA, LAM = 1.0, 0.95
CLIP, VALUE_CLIP = 0.2, 0.2
KL_COEF = 0.05
LR = 1e-5  # actor and critic (TRL has one optimizer for both)
MODEL = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=256, max_position_embeddings=64, tie_word_embeddings=False)
_CONTENT_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"


def score_text(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
               **_: object) -> float:
    """The rule reward (verl's signature, as hpcppo calls a ``path.py:function`` scorer): the fraction of the
    response's characters that are digits (0 for an empty response)."""
    return sum(ch.isdigit() for ch in solution_str) / len(solution_str) if solution_str else 0.0


def prompt_contents() -> list[str]:
    rng = random.Random(0)
    return ["".join(rng.choice(_CONTENT_CHARS) for _ in range(2)) for _ in range(PROMPTS)]


def build(root: Path) -> dict[str, Path]:
    """Write the model, the tokenizer, the verl-schema Parquet prompts and the prompts' token ids under ``root``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hpcppo.data import synthetic
    from hpcppo.tiny import build_tokenizer

    tok = build_tokenizer()
    config = Qwen2Config(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, **MODEL)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    paths = {"model": root / "model", "tokenizer": root / "tokenizer", "train": root / "data" / "train.parquet",
             "prompt_ids": root / "prompt_ids.json"}
    model.save_pretrained(paths["model"])
    tok.save_pretrained(paths["tokenizer"])
    template = synthetic.generate_rows(PROMPTS, seed=0, split="train")
    rows, ids = [], []
    for row, content in zip(template, prompt_contents()):
        messages = [{"role": "user", "content": content}]
        enc = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        enc = enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc
        if len(enc) != PROMPT_LEN:
            raise RuntimeError(f"prompt {content!r} is {len(enc)} tokens, not {PROMPT_LEN}")
        ids.append(list(enc))
        rows.append(row | {"data_source": "bench_peers", "prompt": messages})
    synthetic.write_split(paths["train"], rows)
    paths["prompt_ids"].write_text(json.dumps(ids))
    return paths
