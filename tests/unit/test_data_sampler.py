"""ShardedEpochSampler: partition over ranks, determinism, epochs, resumption (also on another dp size)."""

from __future__ import annotations

import io
import itertools

import pytest
import torch

from hpcppo.data.sampler import ShardedEpochSampler
from hpcppo.errors import ConfigError


def make(num_items=103, batch_size=12, dp_size=1, dp_rank=0, seed=7, **kw) -> ShardedEpochSampler:
    return ShardedEpochSampler(num_items, batch_size=batch_size, dp_rank=dp_rank, dp_size=dp_size, seed=seed, **kw)


def global_stream(dp_size: int, steps: int, state: dict | None = None, **kw) -> list[list[int]]:
    """The global batches over ``steps`` steps, rebuilt from every rank's share (rank 0's share first)."""
    ranks = [make(dp_size=dp_size, dp_rank=r, **kw) for r in range(dp_size)]
    if state is not None:
        for s in ranks:
            s.load_state_dict(state)
    return [list(itertools.chain.from_iterable(s.next_batch() for s in ranks)) for _ in range(steps)]


@pytest.mark.parametrize("dp_size", [1, 2, 3, 4, 6])
def test_ranks_partition_the_global_batch(dp_size):
    reference = make()
    ranks = [make(dp_size=dp_size, dp_rank=r) for r in range(dp_size)]
    for _ in range(25):  # crosses two epoch boundaries (8 steps per epoch)
        expected = reference.global_batch()
        shares = [s.next_batch() for s in ranks]
        reference.next_batch()
        assert all(len(share) == 12 // dp_size for share in shares)
        assert list(itertools.chain.from_iterable(shares)) == expected
        assert len(set(expected)) == 12


def test_epoch_covers_distinct_items_and_reshuffles():
    s = make()
    assert s.steps_per_epoch == 8 and len(s) == 8
    epochs = [[i for batch in s for i in batch] for _ in range(3)]
    for seen in epochs:
        assert len(seen) == 96 and len(set(seen)) == 96 and all(0 <= i < 103 for i in seen)
    assert epochs[0] != epochs[1] != epochs[2]
    assert s.state_dict() == {"epoch": 3, "cursor": 0}


def test_same_seed_same_order_different_seed_differs():
    assert global_stream(1, 20) == global_stream(1, 20)
    assert global_stream(1, 20) != global_stream(1, 20, seed=8)
    # seed and epoch are mixed, not added: (seed 7, epoch 1) is not (seed 8, epoch 0)
    assert list(make(seed=7).epoch_permutation(1)) != list(make(seed=8).epoch_permutation(0))


def test_no_shuffle_is_in_order():
    s = make(num_items=10, batch_size=4, shuffle=False)
    assert [s.next_batch() for _ in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]


def test_drop_last_false_fills_the_last_batch_from_the_same_epoch():
    s = make(num_items=10, batch_size=4, dp_size=2, drop_last=False)
    assert s.steps_per_epoch == 3
    perm = [int(i) for i in s.epoch_permutation(0)]
    globals_ = []
    for _ in range(3):
        globals_.append(s.global_batch())
        assert len(s.next_batch()) == 2
    assert [i for g in globals_ for i in g] == perm + perm[:2]
    assert s.state_dict() == {"epoch": 1, "cursor": 0}
    tiny = make(num_items=3, batch_size=8, drop_last=False)  # fewer prompts than a batch: cycles
    assert sorted(tiny.next_batch()) == sorted([0, 1, 2] * 2 + list(tiny.epoch_permutation(0)[:2]))


@pytest.mark.parametrize(("save_dp", "resume_dp"), [(2, 2), (4, 2), (2, 3), (1, 4)])
def test_resume_from_the_middle_gives_the_identical_remaining_sequence(save_dp, resume_dp):
    full = global_stream(1, 30)
    ranks = [make(dp_size=save_dp, dp_rank=r) for r in range(save_dp)]
    for _ in range(11):  # mid-epoch 1
        for s in ranks:
            s.next_batch()
    states = [s.state_dict() for s in ranks]
    assert all(st == states[0] for st in states), "every rank holds the same cursor"
    buf = io.BytesIO()
    torch.save(states[0], buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert state == {"epoch": 1, "cursor": 36} and all(type(v) is int for v in state.values())
    assert global_stream(resume_dp, 19, state=state) == full[11:]


def test_resume_with_a_larger_batch_starts_at_the_same_prompt():
    s = make(batch_size=12)
    for _ in range(3):
        s.next_batch()
    bigger = make(batch_size=24)
    bigger.load_state_dict(s.state_dict())
    assert bigger.next_batch() == [int(i) for i in s.epoch_permutation(0)[36:60]]
    # 96 prompts consumed: 7 left, not a full batch of 24 -> next epoch
    late = make(batch_size=24)
    late.load_state_dict({"epoch": 0, "cursor": 96})
    assert late.state_dict() == {"epoch": 1, "cursor": 0}


def test_skip_moves_past_batches_across_epochs():
    consumed = make()
    for _ in range(13):
        consumed.next_batch()
    skipped = make()
    skipped.skip(13)
    assert skipped.state_dict() == consumed.state_dict() == {"epoch": 1, "cursor": 60}
    assert skipped.next_batch() == consumed.next_batch()
    with pytest.raises(ValueError, match="non-negative"):
        skipped.skip(-1)


def test_configuration_errors_are_clear():
    with pytest.raises(ConfigError, match="batch_size: batch_size 10 is not divisible by the data-parallel size 4"):
        make(batch_size=10, dp_size=4)
    with pytest.raises(ConfigError, match="3 prompts, fewer than one batch of 12"):
        make(num_items=3)
    with pytest.raises(ConfigError, match="dp_rank 2 is not below dp_size 2"):
        make(dp_size=2, dp_rank=2)
    with pytest.raises(ConfigError, match="seed: must be an integer >= 0"):
        make(seed=-1)
    s = make()
    with pytest.raises(ConfigError, match="cursor=500 is out of range for a data set of 103 prompts"):
        s.load_state_dict({"epoch": 0, "cursor": 500})
    with pytest.raises(ConfigError, match="integer 'epoch' and 'cursor'"):
        s.load_state_dict({"epoch": 0})
