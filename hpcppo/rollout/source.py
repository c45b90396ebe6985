"""The rollout source: where and when a step's samples are produced (docs/rollout-phase.md).

The trainer asks its :class:`RolloutSource` for a step's samples with :meth:`RolloutSource.collect` and a
:class:`StepContext` (step, branch, actor version, seed); the source owns the engine and the weights it holds.
:class:`ColocatedSource` is the one placement today: the engine lives on the trainer's ranks, woken between
updates (wake up, sync the actor's weights if the engine's are stale, run the agent loop, sleep). A split source
(issue 35) would take the same call and answer from rollout ranks that never stop.

The source knows nothing of the trainer: the actor's weights and the step's prompts come through the two callables
it is built with, so ``rollout`` keeps pointing away from ``train``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from hpcppo.rollout.agent_loop import AgentLoop
from hpcppo.rollout.base import RolloutBatch, RolloutEngine, SamplingParams
from hpcppo.rollout.tool_loop import LoopStats, ToolLoop, run_kwargs

WeightStream = Callable[..., Iterable[tuple[str, torch.Tensor]]]
"""``weights(dtype=..., into=...)``: the actor's full tensors by Hugging Face name (a collective iterator)."""


@dataclass(frozen=True)
class StepContext:
    """What a source needs to know of the step it samples for."""

    step: int
    branch: int  # rollbacks so far: a retried step samples afresh
    actor_version: int  # optimizer steps the actor has taken: the weights the samples must come from
    seed: int  # the step's sampling seed (``derive_seed`` of seed, step, rollout group, branch)


@dataclass(frozen=True)
class Collected:
    """One step's samples and what came with them.

    Attributes:
        batch: the samples (prompt-major, ``sampling.n`` per prompt), ``policy_version`` stamped.
        prompts: the step's prompts, in the order ``batch.prompt_index`` counts them (each has ``input_ids``).
        greedy: ReMax's baseline, one greedy response per prompt; None when the estimator needs none.
        times: seconds spent per phase (``weight_sync``, ``generate``), for the step's ``time/*`` metrics.
        metrics: the source's own metrics of the step (split placement's ``rollout/staleness_*`` ...), identical on
            every rank.
        tool_stats: the tool loop's counts of the step on this rank (None: the single-turn loop).
        tool_rewards: the tool loop's per-call step rewards, one list per row of ``batch`` (None: single turn).
        tool_scores: the tool loop's end-of-trajectory ``calc_reward`` per tool, one mapping per row of ``batch``
            (None: single turn).
        greedy_tool_rewards, greedy_tool_scores: the same for the rows of ``greedy``.
    """

    batch: RolloutBatch
    prompts: list[Any]
    greedy: RolloutBatch | None = None
    times: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tool_stats: LoopStats | None = None
    tool_rewards: list[list[float]] | None = None
    tool_scores: list[dict[str, float]] | None = None
    greedy_tool_rewards: list[list[float]] | None = None
    greedy_tool_scores: list[dict[str, float]] | None = None


class RolloutSource(Protocol):
    """Where a step's samples come from."""

    def collect(self, ctx: StepContext) -> Collected:
        """The step's samples from weights of ``ctx.actor_version`` (collective on a colocated source)."""
        ...

    def serving(self, actor_version: int) -> contextlib.AbstractContextManager[AgentLoop]:
        """The agent loop, its engine awake with the actor's weights, for extra generation (validation)."""
        ...


@contextlib.contextmanager
def _timed(times: dict[str, float], phase: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        times[phase] = times.get(phase, 0.0) + time.perf_counter() - start


class ColocatedSource:
    """The engine on the trainer's ranks, between updates: wake up, sync if stale, run the loop, sleep.

    Args:
        engine: this rank's engine.
        loop: the agent loop that drives it.
        weights: the actor's weights as a collective stream (:data:`WeightStream`).
        prompts: the step's prompts (this rollout group's; the same on every rank of the group).
        sampling: the rollout's sampling parameters (the step's seed replaces theirs).
        greedy_baseline: also decode one greedy response per prompt (ReMax).
    """

    def __init__(self, engine: RolloutEngine, loop: AgentLoop, *, weights: WeightStream,
                 prompts: Callable[[], list[Any]], sampling: SamplingParams, greedy_baseline: bool = False):
        self.engine = engine
        self.loop = loop
        self.weights = weights
        self.prompts = prompts
        self.sampling = sampling
        self.greedy_baseline = greedy_baseline
        # The engine holds the actor's weights of version `engine_version`; -1 = not known to match.
        self.engine_version = -1

    def collect(self, ctx: StepContext) -> Collected:
        times: dict[str, float] = {}
        with _timed(times, "weight_sync"):
            self.engine.wake_up()
            self.sync(ctx.actor_version)
        prompts = self.prompts()
        inputs = [p.input_ids for p in prompts]
        rows = run_kwargs(self.loop, prompts)  # each row's tools_kwargs for the tool loop; none for single turn
        with _timed(times, "generate"):
            batch = self.loop.run(inputs, dataclasses.replace(self.sampling, seed=ctx.seed), **rows)
            tools = self.loop if isinstance(self.loop, ToolLoop) else None
            tool_stats = tools.take_stats() if tools is not None else None  # before the greedy run's
            tool_rewards = tools.tool_rewards if tools is not None else None
            tool_scores = tools.reward_scores if tools is not None else None
            greedy, greedy_rewards, greedy_scores = None, None, None
            if self.greedy_baseline:  # verl decodes it with do_sample=False: no draw, the seed changes nothing
                greedy = self.loop.run(inputs, dataclasses.replace(self.sampling, n=1, temperature=0.0, top_p=1.0,
                                                                   top_k=-1, seed=ctx.seed), **rows)
                if tools is not None:
                    greedy_rewards, greedy_scores = tools.tool_rewards, tools.reward_scores
            self.engine.sleep()
        return Collected(batch=batch.stamped(self.engine_version), prompts=prompts, greedy=greedy, times=times,
                         tool_stats=tool_stats, tool_rewards=tool_rewards, tool_scores=tool_scores,
                         greedy_tool_rewards=greedy_rewards, greedy_tool_scores=greedy_scores)

    @contextlib.contextmanager
    def serving(self, actor_version: int) -> Iterator[AgentLoop]:
        self.engine.wake_up()
        self.sync(actor_version)
        yield self.loop
        self.engine.sleep()

    def sync(self, actor_version: int) -> None:
        """Stream the actor's weights into the engine unless it already has this version (e.g. during critic
        warm-up the actor does not change). Collective: every rank decides alike."""
        engine = self.engine
        # An engine that discards its weights while asleep (vLLM, sleep level 2) needs them again every step.
        if self.engine_version != actor_version or engine.weights_dropped:
            # Gathered in the engine's dtype where it has one (bf16 traffic for vLLM); the HF engine takes fp32, and
            # offers its parameters to be gathered into in place (no buffer, no copy).
            targets: Mapping[str, torch.Tensor] | None = engine.sync_targets
            engine.sync_weights(self.weights(dtype=engine.sync_dtype, into=targets))
            self.engine_version = actor_version
