"""Rollout tensor-parallel groups: consecutive ranks (as vLLM builds them), and the sampler sharded by group."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hpcppo.distributed.env import detect_env, rollout_groups
from hpcppo.errors import ConfigError
from hpcppo.train.build import build_sampler


def test_groups_are_consecutive_ranks():
    layout = [(g.dp_rank, g.tp_rank) for g in (rollout_groups(r, 8, 4) for r in range(8))]
    assert layout == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert rollout_groups(5, 8, 1).dp_rank == 5 and rollout_groups(5, 8, 1).dp_size == 8
    assert [rollout_groups(r, 4, 2).is_tp_leader for r in range(4)] == [True, False, True, False]
    with pytest.raises(ConfigError, match="does not divide the world size 6"):
        rollout_groups(0, 6, 4)


def _env(rank: int, world: int):
    return detect_env({"RANK": str(rank), "WORLD_SIZE": str(world)}, device_type="cpu")


def test_sampler_is_sharded_by_group_not_by_rank():
    plan = SimpleNamespace(placement="colocated", tensor_parallel_size=2, dp_size=2, prompts_per_step=8)
    shares = [build_sampler(40, plan, _env(r, 4), seed=1, shuffle=True)[0].next_batch() for r in range(4)]
    assert shares[0] == shares[1] and shares[2] == shares[3]  # one group, one share
    assert len(shares[0]) == 4 and set(shares[0]).isdisjoint(shares[2])
    # tp = 1: exactly the per-rank sharding of before
    plan1 = SimpleNamespace(placement="colocated", tensor_parallel_size=1, dp_size=4, prompts_per_step=8)
    assert [len(build_sampler(40, plan1, _env(r, 4), seed=1, shuffle=True)[0].next_batch()) for r in range(4)] == [2] * 4
    with pytest.raises(RuntimeError, match="planned for 4 rollout groups, this job has 2"):
        build_sampler(40, SimpleNamespace(placement="colocated", tensor_parallel_size=2, dp_size=4, prompts_per_step=8), _env(0, 4),
                      seed=1, shuffle=True)


def test_split_trainers_shard_over_the_trainer_ranks():
    # Split placement: one share per trainer rank (the rollout ranks generate each share as one unit), whatever the
    # rollout side's tensor-parallel size; the trainers' world is the trainer ranks only.
    plan = SimpleNamespace(placement="split", tensor_parallel_size=2, dp_size=1, train_dp_size=2, prompts_per_step=8)
    shares = [build_sampler(40, plan, _env(r, 2), seed=1, shuffle=True) for r in range(2)]
    assert [g.dp_rank for _, g in shares] == [0, 1] and all(g.tp_size == 1 and g.dp_size == 2 for _, g in shares)
    batches = [s.next_batch() for s, _ in shares]
    assert len(batches[0]) == 4 and set(batches[0]).isdisjoint(batches[1])
