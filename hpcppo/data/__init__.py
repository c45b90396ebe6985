"""Prompt data and rewards.

- :mod:`hpcppo.data.dataset` — verl's Parquet schema (read/validate/write), :class:`PromptDataset` (chat template,
  truncation).
- :mod:`hpcppo.data.sampler` — :class:`ShardedEpochSampler`, deterministic and resumable across dp sizes.
- :mod:`hpcppo.data.rewards` — verl-signature reward functions: ``gsm8k``, the synthetic ``arith`` task, user code,
  and dispatch on verl's ``data_source`` names; :mod:`hpcppo.data.math_reward` — MATH / DAPO scorers (math-verify).
- :mod:`hpcppo.data.check` — what ``hpcppo compile`` checks of the data and the reward (no torch, no transformers).
- :mod:`hpcppo.data.gsm8k` — the GSM8K JSONL -> Parquet converter (``tools/prepare_gsm8k.py``).

Names are re-exported lazily so ``import hpcppo.data.rewards`` does not load pyarrow, and nothing here loads torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PromptRecord": "dataset",
    "PromptItem": "dataset",
    "PromptDataset": "dataset",
    "read_prompts": "dataset",
    "write_prompts_parquet": "dataset",
    "ShardedEpochSampler": "sampler",
    "build_reward_fn": "rewards",
    "score_batch": "rewards",
    "gsm8k_compute_score": "rewards",
    "RewardFunctionError": "rewards",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"hpcppo.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'hpcppo.data' has no attribute {name!r}")
