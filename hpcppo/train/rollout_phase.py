"""The rollout phase on the trainer's side: the rollout source built from the run's components, and what the
trainer does with what it collects (the training batch, ReMax's greedy baseline scores). The source itself, the
agent loop and the batch are :mod:`hpcppo.rollout` (docs/rollout-phase.md).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from hpcppo import models
from hpcppo.distributed.env import broadcast_object
from hpcppo.rollout.agent_loop import AgentLoop, SingleTurnLoop
from hpcppo.rollout.base import RolloutBatch
from hpcppo.rollout.source import ColocatedSource
from hpcppo.rollout.split import SplitSource, TrainerEnd
from hpcppo.train.lora import actor_weights


def agent_loop(c: Any) -> AgentLoop:
    """The run's agent loop over ``c.engine`` (the trainer's components, or a rollout rank's parts with ``cfg``,
    ``engine``, ``tokenizer``): the same on a colocated rank and on a rollout rank of a split run."""
    return SingleTurnLoop(c.engine)


def _weights(c: Any) -> Any:
    def weights(**kwargs: Any) -> Any:
        return actor_weights(c.actor.model, **kwargs)

    return weights


def _prompts(c: Any) -> Any:
    def prompts() -> list[Any]:
        return [c.train_data[i] for i in c.sampler.next_batch()]  # this rollout group's prompts

    return prompts


def colocated_source(c: Any, *, greedy_baseline: bool) -> ColocatedSource:
    """The engine on the trainer's ranks with the run's agent loop. The actor, the sampler and the data are looked
    up at each call, so whatever a resume or a rollback put in ``c`` is what the source reads."""
    return ColocatedSource(c.engine, agent_loop(c), weights=_weights(c), prompts=_prompts(c),
                           sampling=c.sampling, greedy_baseline=greedy_baseline)


def bridge_from_env(rank: int, *, backend: str, timeout_s: float) -> Any:
    """This task's end of the bridge (trainer rank 0: ``rank`` 0; a rollout rank: 1 + its index), at the address,
    port and size ``hpcppo.placement.task_env`` exported."""
    from hpcppo.distributed.bridge import Bridge  # split runs only

    env = os.environ
    return Bridge.connect(env["HPCPPO_BRIDGE_ADDR"], int(env["HPCPPO_BRIDGE_PORT"]), rank,
                          int(env["HPCPPO_BRIDGE_SIZE"]), backend="nccl" if backend == "nccl" else "gloo",
                          timeout_s=timeout_s)


def split_source(c: Any, end: TrainerEnd | None, *, timeout_s: float,
                 validation: ColocatedSource | None) -> SplitSource:
    """Split placement's source on a trainer rank (``end``: the bridge on trainer rank 0, None elsewhere). The
    weights go out in the rollout engine's dtype: vLLM's (``model.dtype``), the HF engine's float32 masters as they
    are (``RolloutEngine.sync_dtype`` on the rollout rank, which the trainer does not build)."""
    dtype = None if c.cfg.rollout.engine == "hf" else models.as_torch_dtype(c.cfg.model.dtype)
    return SplitSource(end, weights=_weights(c), weights_dtype=dtype if isinstance(dtype, torch.dtype) else None,
                       prompts=_prompts(c), sampler_state=lambda: c.sampler.state_dict(), share=broadcast_object,
                       dp_rank=c.groups.dp_rank, dp_size=c.groups.dp_size, max_staleness=c.cfg.rollout.max_staleness,
                       total_steps=c.total_steps, timeout_s=timeout_s, validation=validation)


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
