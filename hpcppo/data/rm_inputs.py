"""What the reward model reads: each prompt and response re-templated with the reward model's own chat template.

verl b178a3c re-templates by default: ``reward_model.model.input_tokenizer`` defaults to the actor's path, which
turns on ``RewardModelWorker._switch_chat_template`` (verl/workers/fsdp_workers.py), and the reward loop, verl's
default path at that commit, always does the same (``RewardLoopWorker._preprocess_reward_inputs`` in
verl/experimental/reward_loop/reward_loop.py). For each sample:

1. the response's valid tokens are decoded with the actor's tokenizer, special tokens kept, and every occurrence of
   the actor's EOS string removed;
2. ``{"role": "assistant", "content": response}`` is appended to the prompt's chat messages (verl's ``raw_prompt``);
3. the reward model's tokenizer renders them with its chat template, ``add_generation_prompt=False``, and tokenises
   the text without adding special tokens (the template has them);
4. the ids are cut to ``max_length`` from the right (verl's ``postprocess_data`` with ``truncation="right"``, the
   worker's default) and right-padded.

No torch here (the tokenizers are Hugging Face objects the caller loads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["response_text", "reward_model_text", "reward_model_ids"]


def response_text(actor_tokenizer: Any, response_ids: Sequence[int]) -> str:
    """Step 1: the response's valid ids decoded with special tokens kept, the EOS string removed."""
    text = actor_tokenizer.decode(list(response_ids))
    eos = actor_tokenizer.eos_token
    return text.replace(eos, "") if eos else text


def reward_model_text(rm_tokenizer: Any, messages: Sequence[Mapping[str, str]], response: str) -> str:
    """Steps 2-3: the chat with the response as the assistant's turn, in the reward model's template."""
    chat = [dict(m) for m in messages] + [{"role": "assistant", "content": response}]
    return rm_tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)


def reward_model_ids(rm_tokenizer: Any, actor_tokenizer: Any, prompts: Sequence[Sequence[Mapping[str, str]]],
                     responses: Sequence[Sequence[int]], max_length: int) -> tuple[list[list[int]], int]:
    """The reward model's input ids of each (prompt messages, valid response ids), cut to ``max_length`` from the
    right; and how many were cut."""
    out: list[list[int]] = []
    cut = 0
    for messages, ids in zip(prompts, responses, strict=True):
        text = reward_model_text(rm_tokenizer, messages, response_text(actor_tokenizer, ids))
        tokens = list(rm_tokenizer(text, add_special_tokens=False)["input_ids"])
        if len(tokens) > max_length:
            tokens, cut = tokens[:max_length], cut + 1
        out.append(tokens)
    return out, cut
