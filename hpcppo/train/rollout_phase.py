"""The rollout phase on the trainer's side: the rollout source built from the run's components, and what the
trainer does with what it collects (the training batch, ReMax's greedy baseline scores). The source itself, the
agent loop and the batch are :mod:`hpcppo.rollout` (docs/rollout-phase.md).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from hpcppo import models
from hpcppo.distributed.env import all_reduce_host, broadcast_object
from hpcppo.errors import ConfigError
from hpcppo.rollout.agent_loop import AgentLoop, SingleTurnLoop
from hpcppo.rollout.base import RolloutBatch
from hpcppo.rollout.source import ColocatedSource, Collected
from hpcppo.rollout.split import SplitSource, TrainerEnd
from hpcppo.rollout.tool_loop import (ToolLoop, ToolLoopSettings, check_failures, stats_metrics, stats_vector,
                                      with_tool_results)
from hpcppo.train.lora import actor_weights


def agent_loop(c: Any) -> AgentLoop:
    """The run's agent loop over ``c.engine`` (the trainer's components, or a split run's rollout rank's parts): the
    tool loop with the rank's tool worker (``c.tools``, started and closed with the components) when
    ``rollout.multi_turn.enable``, else the single-turn loop."""
    mt = c.cfg.rollout.multi_turn
    if not mt.enable:
        return SingleTurnLoop(c.engine)
    if c.tools is None or c.tools.worker is None:
        raise RuntimeError("rollout.multi_turn.enable is set but the components have no started tool worker")
    settings = ToolLoopSettings(
        max_response_length=c.cfg.data.max_response_length, format=mt.format,
        max_assistant_turns=mt.max_assistant_turns, max_user_turns=mt.max_user_turns,
        max_parallel_calls=mt.max_parallel_calls, max_tool_response_length=mt.max_tool_response_length,
        tool_response_truncate_side=mt.tool_response_truncate_side,
        max_tool_failures_per_step=mt.max_tool_failures_per_step)
    try:
        return ToolLoop(c.engine, c.tools.worker, c.tokenizer, c.tools.schemas, settings)
    except ValueError as exc:  # a tokenizer whose chat template cannot render a tool turn: one line, at job start
        raise ConfigError(f"{exc} ({c.cfg.model.path})", key="rollout.multi_turn.enable") from None


def tool_metrics(c: Any, got: Collected) -> dict[str, float]:
    """The tool loop's metrics of the step, summed (and maxed) over the ranks, identical on every rank; raises
    :class:`~hpcppo.errors.ToolFailureError` on every rank together when a tool failed more often than
    ``rollout.multi_turn.max_tool_failures_per_step``. Empty (and no collective) for the single-turn loop."""
    if got.tool_stats is None:
        return {}
    names = list(c.tools.schemas)
    sums, maxima = stats_vector(got.tool_stats, names)
    sums, maxima = all_reduce_host(sums, "sum"), all_reduce_host(maxima, "max")
    metrics = stats_metrics(sums, maxima, names)
    check_failures({n: metrics[f"rollout/tool_failures/{n}"] for n in names},
                   c.cfg.rollout.multi_turn.max_tool_failures_per_step)
    return metrics


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
                           sampling=c.sampling, greedy_baseline=greedy_baseline,
                           shard=(c.groups.dp_rank, c.groups.dp_size))


def bridge_from_env(rank: int, *, backend: str, timeout_s: float) -> Any:
    """This task's end of the bridge (trainer rank 0: ``rank`` 0; a rollout rank: 1 + its index), at the address,
    port and size ``hpcppo.placement.task_env`` exported."""
    from hpcppo.distributed.bridge import Bridge  # split runs only

    env = os.environ
    return Bridge.connect(env["HPCPPO_BRIDGE_ADDR"], int(env["HPCPPO_BRIDGE_PORT"]), rank,
                          int(env["HPCPPO_BRIDGE_SIZE"]), backend="nccl" if backend == "nccl" else "gloo",
                          timeout_s=timeout_s)


def split_source(c: Any, end: TrainerEnd | None, *, timeout_s: float) -> SplitSource:
    """Split placement's source on a trainer rank (``end``: the bridge on trainer rank 0, None elsewhere). The
    weights go out in the rollout engine's dtype: vLLM's (``model.dtype``), the HF engine's float32 masters as they
    are (``RolloutEngine.sync_dtype`` on the rollout rank, which the trainer does not build)."""
    dtype = None if c.cfg.rollout.engine == "hf" else models.as_torch_dtype(c.cfg.model.dtype)
    return SplitSource(end, weights=_weights(c), weights_dtype=dtype if isinstance(dtype, torch.dtype) else None,
                       prompts=_prompts(c), sampler_state=lambda: c.sampler.state_dict(), share=broadcast_object,
                       dp_rank=c.groups.dp_rank, dp_size=c.groups.dp_size, max_staleness=c.cfg.rollout.max_staleness,
                       total_steps=c.total_steps, timeout_s=timeout_s)


def greedy_baseline_scores(c: Any, prompts: list[Any], greedy: RolloutBatch,
                           tool_rewards: list[list[float]] | None = None,
                           tool_scores: list[dict[str, float]] | None = None) -> torch.Tensor:
    """ReMax's baseline: the score of the greedy response of each prompt (``[len(prompts)]``), as verl's trainer
    scores the ``do_sample=False`` batch before the rollout's is repeated n times (verl b178a3c,
    ``verl/trainer/ppo/ray_trainer.py``, ``fit``, the ``AdvantageEstimator.REMAX`` branch). The text and the length
    are the whole continuation (the attention mask); the tool loop's results of the greedy rows (``tool_rewards``,
    ``tool_scores``) reach the reward function as the sampled rows' do (``with_tool_results``)."""
    records = [p.record for p in prompts]
    attend = greedy.response_attention_mask
    if c.reward_model is not None:  # verl scores the baseline with the reward model too (rm_scores)
        return c.reward_model.score(c.tokenizer, records, greedy.response_ids, attend)[0].cpu()
    texts = c.tokenizer.batch_decode(greedy.response_ids * attend, skip_special_tokens=True)
    extra = [r.extra_info for r in records]
    if tool_rewards is not None:
        extra = with_tool_results(extra, tool_rewards, tool_scores)
    scores = c.score_fn([r.data_source for r in records], texts, [r.ground_truth for r in records],
                        extra, lengths=attend.sum(-1).tolist())
    return torch.tensor(scores, dtype=torch.float32)
