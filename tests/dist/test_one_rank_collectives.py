"""On a 1-rank group the multi-rank code paths are skipped (a host reduction or a gather of one rank changes
nothing), so a check on a single GPU (``tools/gpu_check.sh``) would never run them on NCCL. ``force_collective``
(``all_reduce_host``) and ``force_gather`` (``iter_full_params``) take the multi-rank path anyway. Here, on one
real gloo rank, the collectives are counted at ``torch.distributed``'s own functions: none without the flag, the
expected ones with it, and the numbers are the same either way.
"""

from __future__ import annotations

import torch
from _spawn import run_distributed
from torch import nn

COLLECTIVES = ("all_reduce", "broadcast", "all_gather_into_tensor", "all_gather_single")


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.embed = nn.Embedding(10, 8)
        self.blocks = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # never called here
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.norm(h)


def _worker(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from hpcppo.distributed import weights
    from hpcppo.distributed.env import all_reduce_host, collective_device
    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.mesh import build_mesh

    calls: list[tuple[str, str, str]] = []
    for name in COLLECTIVES:  # record every call of the collectives hpcppo uses, then run the real one
        real = getattr(dist, name, None)
        if real is not None:
            def recording(tensor, *args, _real=real, _name=name, **kwargs):
                calls.append((_name, tensor.device.type, str(tensor.dtype)))
                return _real(tensor, *args, **kwargs)
            setattr(dist, name, recording)

    out: dict = {"world": dist.get_world_size(), "device": str(collective_device())}
    values = [1.0, 2.0**53, -3.5]
    for force in (False, True):
        for op in ("sum", "mean", "max"):
            calls.clear()
            out[("host", force, op)] = {"values": all_reduce_host(values, op, force_collective=force),
                                        "calls": list(calls)}

    mesh = build_mesh("cpu", world, 1, hsdp=False)
    model = apply_fsdp(Small(), mesh, param_dtype=None, reduce_dtype=None, cpu_offload=False,
                       reshard_after_forward=True, layer_classes=(nn.Linear,))
    expected = {weights.clean_name(n): p.full_tensor().clone() for n, p in model.named_parameters()}
    out["names"] = list(expected)
    by_broadcasts = weights._by_broadcasts
    for via in ("broadcasts", "all-gather"):  # gloo's way, and the backend all-gather NCCL uses
        weights._by_broadcasts = lambda inp, group, _via=via: _via == "broadcasts"
        try:
            for force in (False, True):
                for dtype in (None, torch.bfloat16):
                    calls.clear()
                    got = list(weights.iter_full_params(model, dtype=dtype, bucket_bytes=1 << 20,
                                                        force_gather=force))
                    want = {n: t if dtype is None else t.to(dtype) for n, t in expected.items()}
                    out[("bucket", via, force, dtype)] = {
                        "names": [n for n, _ in got], "calls": list(calls),
                        "exact": all(t.dtype == want[n].dtype and torch.equal(t, want[n]) for n, t in got)}
                targets = {n: torch.zeros_like(t) for n, t in expected.items()}
                calls.clear()
                got = list(weights.iter_full_params(model, into=targets, direct_min_bytes=0, force_gather=force))
                out[("into", via, force)] = {
                    "calls": list(calls), "exact": all(torch.equal(t, expected[n]) for n, t in got),
                    "in_place": sorted(n for n, t in got if t is targets[n])}
        finally:
            weights._by_broadcasts = by_broadcasts
    return out


def test_forced_paths_run_the_collectives_on_one_rank():
    (r,) = run_distributed(_worker, 1)
    assert r["world"] == 1 and r["device"] == "cpu"
    for op in ("sum", "mean", "max"):
        assert r[("host", False, op)] == {"values": [1.0, 2.0**53, -3.5], "calls": []}, op  # the shortcut
        # forced: one float64 all-reduce on the collective device, and the numbers come back exact
        assert r[("host", True, op)] == {"values": [1.0, 2.0**53, -3.5],
                                         "calls": [("all_reduce", "cpu", "torch.float64")]}, op
    names = r["names"]
    assert len(names) == 7  # embed, 2 x (weight, bias), norm weight and bias
    gathers = {"broadcasts": {"broadcast"}, "all-gather": {"all_gather_into_tensor", "all_gather_single"}}
    for via in ("broadcasts", "all-gather"):
        for dtype in (None, torch.bfloat16):
            plain, forced = r[("bucket", via, False, dtype)], r[("bucket", via, True, dtype)]
            assert plain["calls"] == [] and plain["exact"] and plain["names"] == names, (via, dtype, plain)
            assert forced["exact"] and forced["names"] == names, (via, dtype, forced)
            # everything fits one bucket: one collective, on the gather's dtype
            (call,) = forced["calls"]
            assert call[0] in gathers[via] and call[2] == str(dtype or torch.float32), call
        plain, forced = r[("into", via, False)], r[("into", via, True)]
        assert plain["calls"] == [] and plain["in_place"] == [] and plain["exact"], plain
        # forced: each parameter gathered straight into the consumer's tensor, one collective each
        assert forced["in_place"] == sorted(names) and forced["exact"], forced
        assert len(forced["calls"]) == len(names), forced["calls"]
        assert {c[0] for c in forced["calls"]} <= gathers[via], forced["calls"]
