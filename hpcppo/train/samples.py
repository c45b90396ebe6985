"""Sample trajectories of a step, for people to read (``trainer.log_samples``; ``hpcppo samples RUN``).

After the reward phase rank 0 writes ``samples/step-<N>.jsonl`` (atomically; a step redone after a rollback or a
resume replaces it): ``trainer.log_samples`` rows of its batch, spread over it (rows are prompt-major, so that
several prompts show rather than one prompt's n samples). Each line is one row::

    {"step": 12, "row": 0, "data_source": "arith", "ground_truth": "408", "prompt": "...",
     "turns": [{"role": "model", "text": "...", "tokens": 9}, {"role": "tool", "text": "...", "tokens": 5}, ...],
     "reward": 1.0, "response_tokens": 31, "model_tokens": 20, "num_turns": 3, "tool_calls": 1}

The turns come from the two masks (docs/rollout-phase.md): over the response's attended tokens (attention mask 1),
each run of tokens with loss mask 1 is a ``model`` turn (sampled by the model) and each run with loss mask 0 a
``tool`` turn (a tool's answer and the template around it). Token ids are decoded run by run, special tokens kept:
the text is what the model saw. ``num_turns`` and ``tool_calls`` are written when the rollout loop puts them in the
batch (per-row ``[B]`` tensors or lists under those names), and so are the tool loop's results that reached the
reward function: ``tool_rewards`` (the calls' step rewards, verl's ``tool_rewards``) and ``tool_scores`` (each tool's
end-of-trajectory ``calc_reward``, verl's ``rollout_reward_scores``); the reward is the row's summed
``token_level_scores``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from hpcppo.fsutil import atomic_write_text
from hpcppo.rundir.paths import RunPaths

__all__ = ["turns", "sample_rows", "write_samples", "PER_ROW_KEYS"]

#: Per-row values the rollout loop may put in the batch; written when present.
PER_ROW_KEYS = ("num_turns", "tool_calls", "tool_rewards", "tool_scores")


def turns(ids: Sequence[int], attention: Sequence[int], loss: Sequence[int]) -> list[tuple[str, list[int]]]:
    """The response's attended tokens as runs: ``("model", ids)`` where the loss mask is 1, ``("tool", ids)``
    where it is 0, in order."""
    out: list[tuple[str, list[int]]] = []
    for token, attended, trained in zip(ids, attention, loss):
        if not attended:
            continue
        role = "model" if trained else "tool"
        if out and out[-1][0] == role:
            out[-1][1].append(int(token))
        else:
            out.append((role, [int(token)]))
    return out


def _rows(total: int, count: int) -> list[int]:
    """``count`` row indices spread evenly over ``total`` rows (all of them when ``count >= total``)."""
    if count >= total:
        return list(range(total))
    return sorted({i * total // count for i in range(count)})


def _per_row(value: Any, row: int) -> Any:
    item = value[row]
    return item.item() if isinstance(item, torch.Tensor) else item


def sample_rows(batch: dict[str, Any], tokenizer: Any, step: int, count: int) -> list[dict[str, Any]]:
    """The sample records of ``count`` rows of a scored batch: ``input_ids`` and ``attention_mask`` (the prompt is
    their first ``P`` columns, where attended), ``responses``, both response masks, ``token_level_scores`` and
    ``records``."""
    responses = batch["responses"]
    width = responses.shape[1]
    prompt_ids = batch["input_ids"][:, :-width].tolist() if width else batch["input_ids"].tolist()
    prompt_att = batch["attention_mask"][:, :-width].tolist() if width else batch["attention_mask"].tolist()
    rewards = batch["token_level_scores"].float().sum(-1).tolist()
    out = []
    for row in _rows(responses.shape[0], count):
        record = batch["records"][row]
        attention = batch["response_attention_mask"][row].tolist()
        loss = batch["response_mask"][row].tolist()
        runs = turns(responses[row].tolist(), attention, loss)
        sample: dict[str, Any] = {
            "step": step, "row": row, "data_source": record.data_source, "ground_truth": record.ground_truth,
            "prompt": tokenizer.decode([t for t, a in zip(prompt_ids[row], prompt_att[row]) if a],
                                       skip_special_tokens=False),
            "turns": [{"role": role, "text": tokenizer.decode(ids, skip_special_tokens=False), "tokens": len(ids)}
                      for role, ids in runs],
            "reward": rewards[row], "response_tokens": int(sum(attention)),
            "model_tokens": int(sum(a * m for a, m in zip(attention, loss)))}
        sample |= {key: _per_row(batch[key], row) for key in PER_ROW_KEYS if key in batch}
        out.append(sample)
    return out


def write_samples(run_dir: Path, step: int, batch: dict[str, Any], tokenizer: Any, count: int) -> Path | None:
    """Write the run's ``samples/step-<step>.jsonl`` atomically (``count`` rows); None when ``count`` is 0."""
    if count <= 0:
        return None
    run = RunPaths(run_dir)
    lines = [json.dumps(s, ensure_ascii=False, default=str, allow_nan=True) for s in
             sample_rows(batch, tokenizer, step, count)]
    path = run.sample_file(step)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return path
