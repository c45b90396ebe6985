"""The agent loop: how one step's prompts become trajectories, token in and token out (docs/rollout-phase.md).

An :class:`AgentLoop` turns prompts into a :class:`~hpcppo.rollout.base.RolloutBatch`. The single-turn loop is
one ``engine.generate``, whose batch is used as it comes (no per-sample lists in between: the colocated path stays
as fast as the engine). A loop that builds its samples turn by turn (the tool loop of issue 34) produces
:class:`Trajectory` objects, each with its own loss mask, and assembles them with :func:`batch_from_trajectories`;
the batch then has a loss mask (``response_mask``) narrower than its attention mask.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from hpcppo.rollout.base import PromptInput, RolloutBatch, RolloutEngine, SamplingParams, assemble_batch, left_pad


@runtime_checkable
class AgentLoop(Protocol):
    """Prompts in, one step's samples out: ``sampling.n`` rows per prompt, prompt-major, seeded by
    ``sampling.seed`` (see :mod:`hpcppo.rollout.base`). ``tools_kwargs``: per prompt, its row's tool arguments
    by tool name (``hpcppo.rollout.tool_loop.run_kwargs`` builds them; a loop without tools ignores them)."""

    def run(self, prompts: PromptInput, sampling: SamplingParams,
            tools_kwargs: Sequence[Mapping[str, Any]] | None = None) -> RolloutBatch:
        ...


@dataclass(frozen=True)
class SingleTurnLoop:
    """Today's rollout: one ``engine.generate``; both masks are the engine's response mask."""

    engine: RolloutEngine

    def run(self, prompts: PromptInput, sampling: SamplingParams,
            tools_kwargs: Sequence[Mapping[str, Any]] | None = None) -> RolloutBatch:
        return self.engine.generate(prompts, sampling)  # no tools: tools_kwargs concern none


@dataclass(frozen=True)
class Trajectory:
    """One sample built turn by turn, as token ids exactly as sampled or appended (never decoded and re-tokenised).

    Attributes:
        prompt_ids: the prompt's tokens.
        response_ids: every turn after the prompt, concatenated.
        loss_mask: one per response token: 1 where the model sampled it, 0 on tool and template tokens.
        rollout_log_probs: one per response token (0 where ``loss_mask`` is 0).
        policy_version: one per response token: the actor version whose weights sampled it.
        prompt_index: the prompt (0..num_prompts-1) it answers.
    """

    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    loss_mask: Sequence[int]
    rollout_log_probs: Sequence[float]
    policy_version: Sequence[int]
    prompt_index: int

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        lengths = (len(self.loss_mask), len(self.rollout_log_probs), len(self.policy_version))
        if any(length != n for length in lengths):
            raise ValueError(f"a trajectory of {n} response tokens has {lengths[0]} loss-mask entries, "
                             f"{lengths[1]} log-probs and {lengths[2]} versions")


def batch_from_trajectories(trajectories: Sequence[Trajectory], pad_token_id: int) -> RolloutBatch:
    """Assemble trajectories (prompt-major, as the loop produced them) into a batch: responses right padded, the
    attention mask over every response token, the loss mask from each trajectory's, versions as given."""
    if not trajectories:
        raise ValueError("no trajectories to assemble")
    width = max(1, max(len(t.response_ids) for t in trajectories))  # R >= 1, as batch_from_lists keeps it
    rows = len(trajectories)
    response_ids = torch.full((rows, width), int(pad_token_id), dtype=torch.long)
    attend = torch.zeros((rows, width), dtype=torch.long)
    loss = torch.zeros((rows, width), dtype=torch.long)
    log_probs = torch.zeros((rows, width), dtype=torch.float32)
    version = torch.full((rows, width), -1, dtype=torch.long)
    for i, t in enumerate(trajectories):
        n = len(t.response_ids)
        response_ids[i, :n] = torch.as_tensor(list(t.response_ids), dtype=torch.long)
        attend[i, :n] = 1
        loss[i, :n] = torch.as_tensor(list(t.loss_mask), dtype=torch.long)
        log_probs[i, :n] = torch.as_tensor(list(t.rollout_log_probs), dtype=torch.float32)
        version[i, :n] = torch.as_tensor(list(t.policy_version), dtype=torch.long)
    prompt_ids, prompt_mask = left_pad([t.prompt_ids for t in trajectories], pad_token_id)
    return assemble_batch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                          response_mask=loss, rollout_log_probs=log_probs,
                          prompt_index=torch.tensor([t.prompt_index for t in trajectories], dtype=torch.long),
                          response_attention_mask=attend, policy_version=version)
