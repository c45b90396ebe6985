"""Helpers of the vLLM tier: build the real engines on the tiny model, compare greedy generations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

MAX_NEW = 8
KV_CACHE_BYTES = 64 * 2**20


def prompts(data_dir: Path, count: int = 16) -> list[list[int]]:
    """``count`` tokenised validation prompts of the tiny task (as the trainer tokenises them)."""
    from transformers import PreTrainedTokenizerFast

    from hpcppo.data.dataset import PromptDataset, read_prompts

    tok = PreTrainedTokenizerFast.from_pretrained(str(data_dir.parent / "model"))
    ds = PromptDataset(read_prompts([str(data_dir / "val.parquet")]), tok, max_prompt_length=48)
    return [ds[i].input_ids for i in range(count)]


def greedy(n: int = 1, seed: int | None = None, temperature: float = 0.0) -> Any:
    from hpcppo.rollout import SamplingParams

    return SamplingParams(eos_token_id=(3,), pad_token_id=0, n=n, temperature=temperature, max_new_tokens=MAX_NEW,
                          seed=seed)


def rows(batch: Any) -> list[list[int]]:
    """Each response's tokens up to and including its EOS (padding dropped)."""
    return [batch.response_ids[i, : int(batch.response_lengths[i])].tolist() for i in range(batch.num_samples)]


def vllm_engine(model_dir: Path, **kw: Any) -> Any:
    """The project's real engine on vLLM's CPU backend, in float32 (the dtype both engines compute alike here)."""
    from hpcppo.rollout.vllm_engine import VLLMRolloutEngine

    args: dict[str, Any] = dict(dtype="float32", enforce_eager=True, enable_sleep_mode=False, load_format="dummy",
                                max_model_len=64, seed=0, kv_cache_memory_bytes=KV_CACHE_BYTES)
    args.update(kw)
    return VLLMRolloutEngine(model_dir, **args)


def hf_engine(model_dir: Path) -> Any:
    from hpcppo.rollout.hf import HFRolloutEngine

    return HFRolloutEngine.from_pretrained(model_path=model_dir, dtype="float32", device=torch.device("cpu"))


def perturb_with_adam(model: torch.nn.Module, ids: list[list[int]], *, lr: float = 3e-3, steps: int = 2) -> None:
    """A few real optimizer steps on a next-token loss: weights move the way the trainer moves them."""
    from hpcppo.rollout.base import left_pad

    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    x, mask = left_pad(ids, 0)
    for _ in range(steps):
        logits = model(input_ids=x, attention_mask=mask).logits[:, :-1]
        loss = -torch.log_softmax(logits, -1).gather(-1, x[:, 1:, None]).mean()  # push towards the prompts
        opt.zero_grad()
        loss.backward()
        opt.step()
