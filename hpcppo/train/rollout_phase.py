"""The rollout phase on the trainer's side: the rollout source built from the run's components, and what the
trainer does with what it collects (the training batch, ReMax's greedy baseline scores). The source itself, the
agent loop and the batch are :mod:`hpcppo.rollout` (docs/rollout-phase.md).
"""

from __future__ import annotations

from typing import Any

import torch

from hpcppo.rollout.agent_loop import SingleTurnLoop
from hpcppo.rollout.base import RolloutBatch
from hpcppo.rollout.source import ColocatedSource
from hpcppo.train.lora import actor_weights


def colocated_source(c: Any, *, greedy_baseline: bool) -> ColocatedSource:
    """The engine on the trainer's ranks with the single-turn loop. The actor, the sampler and the data are looked
    up at each call, so whatever a resume or a rollback put in ``c`` is what the source reads."""

    def weights(**kwargs: Any) -> Any:
        return actor_weights(c.actor.model, **kwargs)

    def prompts() -> list[Any]:
        return [c.train_data[i] for i in c.sampler.next_batch()]  # this rollout group's prompts

    return ColocatedSource(c.engine, SingleTurnLoop(c.engine), weights=weights, prompts=prompts,
                           sampling=c.sampling, greedy_baseline=greedy_baseline)


def greedy_baseline_scores(c: Any, prompts: list[Any], greedy: RolloutBatch) -> torch.Tensor:
    """ReMax's baseline: the score of the greedy response of each prompt (``[len(prompts)]``), as verl's trainer
    scores the ``do_sample=False`` batch before the rollout's is repeated n times (verl b178a3c,
    ``verl/trainer/ppo/ray_trainer.py``, ``fit``, the ``AdvantageEstimator.REMAX`` branch). The text and the length
    are the whole continuation (the attention mask)."""
    records = [p.record for p in prompts]
    attend = greedy.response_attention_mask
    if c.reward_model is not None:  # verl scores the baseline with the reward model too (rm_scores)
        return c.reward_model.score(c.tokenizer, records, greedy.response_ids, attend)[0].cpu()
    texts = c.tokenizer.batch_decode(greedy.response_ids * attend, skip_special_tokens=True)
    scores = c.score_fn([r.data_source for r in records], texts, [r.ground_truth for r in records],
                        [r.extra_info for r in records], lengths=attend.sum(-1).tolist())
    return torch.tensor(scores, dtype=torch.float32)
