"""Bucketed weight streaming (``iter_full_params(bucket_bytes=...)``) on 3 real gloo ranks.

Three ranks make FSDP2's ``Shard(0)`` split uneven: a dim-0 of 5 is cut 2/2/1, a dim-0 of 2 is cut 1/1/0 (the last
rank holds an empty shard), so the padding and the cut-off after the gather are exercised, not just the even case.
Every streamed tensor is compared bit for bit with ``DTensor.full_tensor()`` of the same parameter, at bucket sizes
from "one parameter per gather" to "everything in one gather", and the all-gathers are counted. Both ways of
gathering run: one broadcast per rank (what gloo uses) and the backend's all-gather (what NCCL uses), into
buckets and straight into the consumer's own tensors (``into``).
"""

from __future__ import annotations

import torch
from _spawn import run_distributed
from torch import nn


class Odd(nn.Module):
    """Parameters whose first dimension does not divide by 3, one smaller than 3, and 1-D ones."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.embed = nn.Embedding(10, 4)  # 10 rows: 4/4/2
        self.blocks = nn.ModuleList([nn.Linear(4, 5), nn.Linear(5, 2), nn.Linear(2, 4)])  # 5: 2/2/1, 2: 1/1/0
        self.norm = nn.LayerNorm(4)
        self.even = nn.Linear(4, 6)  # 6 rows: 2/2/2, the one layout the backend's all-gather can fill in place

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.even(self.norm(h))


def _PER_NAME(name: str) -> torch.dtype | None:
    """A dtype per parameter (as LoRA's sync asks: the merged layers in the master dtype, the rest in the engine's):
    bf16 for the blocks, as stored for the others, so buckets change dtype mid-model."""
    return torch.bfloat16 if name.startswith("blocks.") else None


def _worker(rank: int, world: int) -> dict:
    from torch.distributed.tensor import DTensor

    from hpcppo.distributed import weights
    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.mesh import build_mesh

    mesh = build_mesh("cpu", world, 1, hsdp=False)
    out: dict = {"gloo_broadcasts": weights._by_broadcasts(torch.zeros(1), mesh.get_group(0))}
    for via, offload in ((v, o) for v in ("broadcasts", "all-gather") for o in (False, True)):
        model = apply_fsdp(Odd(), mesh, param_dtype=None, reduce_dtype=None, cpu_offload=offload,
                           reshard_after_forward=True, layer_classes=(nn.Linear,))
        expected = {weights.clean_name(n): p.full_tensor() for n, p in model.named_parameters()}
        out["local_rows"] = {n: p.to_local().shape[0] for n, p in model.named_parameters()}
        out["all_dtensor"] = all(isinstance(p, DTensor) for p in model.parameters())
        for dtype in (None, torch.bfloat16, _PER_NAME):
            for bucket_bytes in (1, 64, 1 << 20):
                gathers = []
                real = weights._all_gather

                def counting(out_, inp, group):  # a recording wrapper around the real collective
                    gathers.append(inp.numel())
                    real(out_, inp, group)

                weights._all_gather = counting
                by_broadcasts = weights._by_broadcasts
                weights._by_broadcasts = lambda inp, group: via == "broadcasts"
                try:
                    got = list(weights.iter_full_params(model, dtype=dtype, bucket_bytes=bucket_bytes))
                finally:
                    weights._all_gather, weights._by_broadcasts = real, by_broadcasts
                want = {n: t if (d := dtype(n) if callable(dtype) else dtype) is None else t.to(d)
                        for n, t in expected.items()}
                out[(via, offload, dtype, bucket_bytes)] = {
                    "names": [n for n, _ in got],
                    "exact": all(t.dtype == want[n].dtype and torch.equal(t, want[n]) for n, t in got),
                    "contiguous": [(n, tuple(t.shape), t.stride()) for n, t in got if not t.is_contiguous()],
                    "gathers": len(gathers),
                }
            # Gathered in place into the consumer's tensors (into=...): one target of the wrong dtype is not used.
            targets = {n: torch.zeros(t.shape, dtype=torch.float64 if n == "blocks.2.bias" else t.dtype)
                       for n, t in expected.items()}
            for window in (0, 1 << 20):  # each waited for before the next starts; all in flight together
                for t in targets.values():
                    t.zero_()
                by_broadcasts = weights._by_broadcasts
                weights._by_broadcasts = lambda inp, group: via == "broadcasts"
                try:
                    got = list(weights.iter_full_params(model, into=targets, direct_min_bytes=0,
                                                        in_flight_window=window))
                finally:
                    weights._by_broadcasts = by_broadcasts
                out[(via, offload, "into", window)] = {
                    "names": [n for n, _ in got],
                    "exact": all(torch.equal(t, expected[n]) for n, t in got),
                    "in_place": sorted(n for n, t in got if t is targets[n]),
                }
        out["expected_names"] = list(expected)
    return out


def test_buckets_stream_exact_full_tensors_on_uneven_shards():
    results = run_distributed(_worker, 3)
    names = results[0]["expected_names"]
    assert len(names) == 11  # embed, 3 x (weight, bias), norm weight and bias, even weight and bias
    # The uneven split really happened: rank 2 holds 2 of the embedding's 10 rows and none of the 2-row weight.
    assert results[2]["local_rows"]["embed.weight"] == 2
    assert results[2]["local_rows"]["blocks.1.weight"] == 0 and results[0]["local_rows"]["blocks.1.weight"] == 1
    for r in results:
        assert r["all_dtensor"] and r["gloo_broadcasts"]
        for via, offload, dtype in ((v, o, d) for v in ("broadcasts", "all-gather") for o in (False, True)
                                    for d in (None, torch.bfloat16, _PER_NAME)):
            per_param = r[(via, offload, dtype, 1)]
            small = r[(via, offload, dtype, 64)]
            whole = r[(via, offload, dtype, 1 << 20)]
            for case in (per_param, small, whole):
                assert case["names"] == names  # the order of named_parameters, whatever the buckets
                assert case["exact"], (via, offload, dtype)
                assert not case["contiguous"], case["contiguous"]
            assert per_param["gathers"] == len(names)  # each parameter alone
            # the whole model in one collective; per-name dtypes: embed | blocks (bf16) | norm and even
            assert whole["gathers"] == (3 if dtype is _PER_NAME else 1)
            assert 1 < small["gathers"] < len(names)
        for via, offload, window in ((v, o, w) for v in ("broadcasts", "all-gather") for o in (False, True)
                                     for w in (0, 1 << 20)):
            case = r[(via, offload, "into", window)]
            # Every parameter once; the bucketed ones no longer wait for the in-place ones before them, so the
            # order is not named_parameters' but it is the same on every rank.
            assert sorted(case["names"]) == sorted(names) and case["exact"], (via, offload)
            assert all(other[(via, offload, "into", window)]["names"] == case["names"] for other in results)
            if via == "broadcasts":  # any split: every rank's rows are a slice of the target
                assert case["in_place"] == sorted(set(names) - {"blocks.2.bias"}), case
            else:  # an uneven split would need a padded buffer: only the 6-row parameters go in place
                assert case["in_place"] == ["even.bias", "even.weight"], case
