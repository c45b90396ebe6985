"""A rollout batch travels and is checkpointed as its state (``RolloutBatch.state``): the columns it cannot be
rebuilt without, in narrow exact dtypes. Pickled (a unit over the bridge, a unit shared among trainer ranks) or
saved (a split checkpoint's queued units, read with ``weights_only=True``), it comes back equal column for column
and dtype for dtype, in under a quarter of the bytes."""

from __future__ import annotations

import io
import pickle
from dataclasses import fields

import pytest
import torch

from hpcppo.rollout.agent_loop import Trajectory, batch_from_trajectories
from hpcppo.rollout.base import RolloutBatch

PAD = 0


def multi_turn(rows: int = 4, prompt: int = 8, response: int = 64, vocab: int = 151_936) -> RolloutBatch:
    """Rows of different lengths, a tool turn (loss mask 0, attended) in each, stamped versions, real log-probs."""
    g = torch.Generator().manual_seed(0)
    trajectories = []
    for i in range(rows):
        p = torch.randint(1, vocab, (prompt - i,), generator=g).tolist()
        n = response - 3 * i
        r = torch.randint(1, vocab, (n,), generator=g).tolist()
        loss = [0 if n // 3 <= k < n // 2 else 1 for k in range(n)]
        lps = [-float(x) if m else 0.0 for x, m in zip(torch.rand(n, generator=g).tolist(), loss)]
        trajectories.append(Trajectory(prompt_ids=p, response_ids=r, loss_mask=loss, rollout_log_probs=lps,
                                       policy_version=[5] * n, prompt_index=i))
    return batch_from_trajectories(trajectories, PAD)


def assert_same(a: RolloutBatch, b: RolloutBatch) -> None:
    for f in fields(RolloutBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert x.dtype == y.dtype and torch.equal(x, y), f.name


def test_a_pickled_batch_comes_back_equal_in_under_a_quarter_of_the_bytes():
    b = multi_turn(rows=16, prompt=32, response=256)
    assert not torch.equal(b.response_mask, b.response_attention_mask)  # both masks travel
    data = pickle.dumps(b, protocol=pickle.HIGHEST_PROTOCOL)
    assert_same(pickle.loads(data), b)
    # every column as the trainer holds it, pickled as plain tensors
    full = pickle.dumps({f.name: getattr(b, f.name) for f in fields(b)}, protocol=pickle.HIGHEST_PROTOCOL)
    assert len(data) * 4 < len(full), (len(data), len(full))


def test_a_saved_state_loads_with_weights_only():
    b = multi_turn(rows=2, response=16).stamped(9)
    torch.save(b.state(), buf := io.BytesIO())
    buf.seek(0)
    assert_same(RolloutBatch.from_state(torch.load(buf, weights_only=True)), b)


def test_a_token_id_outside_int32_is_refused_not_wrapped():
    b = multi_turn(rows=1, response=4)
    wide = RolloutBatch.from_state(b.state() | {"response_ids": b.response_ids.long() + 2**31})
    with pytest.raises(ValueError, match="response_ids holds a token id outside int32"):
        wide.state()
