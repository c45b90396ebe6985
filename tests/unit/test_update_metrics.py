"""UpdateMetrics: device scalars copied to the host once per update, with the numbers float() would give."""

from __future__ import annotations

import math

import torch

from hpcppo.train.batching import UpdateMetrics


def test_reduce_equals_float_per_sample_times_scale():
    g = torch.Generator().manual_seed(0)
    samples = {
        # A loss with its graph, as the trainer passes it: add() must detach it.
        "a/loss": [((torch.rand((), generator=g).requires_grad_() * 3), 4) for _ in range(5)],
        "a/clipfrac": [(torch.rand((), generator=g), 1) for _ in range(5)],
        "a/bf16": [(torch.rand((), generator=g).to(torch.bfloat16), 2) for _ in range(3)],
        "a/grad_norm": [(1.2345678901234567, 1), (float("inf"), 1)],
    }
    m = UpdateMetrics()
    for key, pairs in samples.items():
        for value, scale in pairs:
            m.add(key, value, scale)
    out = m.reduce()
    for key, pairs in samples.items():
        expected = [float(v.detach() if isinstance(v, torch.Tensor) else v) * s for v, s in pairs]
        want = sum(expected) / len(expected)
        assert out[key] == want or (math.isinf(want) and math.isinf(out[key])), key
    assert sorted(out) == sorted(samples)


def test_empty_update_reduces_to_nothing():
    assert UpdateMetrics().reduce() == {}
