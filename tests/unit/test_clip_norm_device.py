"""The gradient-norm clip reduces a sharded norm on its mesh's device (FSDP2 ``cpu_offload`` keeps gradients in
host memory while the mesh is a CUDA/NCCL one), and gives torch's own numbers where nothing has to move."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from hpcppo.train import batching


class _OffloadedNorm:
    """Stands in for a ``Partial`` DTensor norm computed from CPU-offloaded shards of a CUDA mesh."""

    def __init__(self, value: torch.Tensor):
        self.value = value
        self.device = torch.device("cpu")
        self.device_mesh = SimpleNamespace(device_type="cuda")
        self.moved_to: list[torch.device] = []

    def to(self, device):
        self.moved_to.append(torch.device(device))
        return self.value


def test_norm_device_is_the_mesh_device_when_the_norm_sits_elsewhere():
    assert batching.norm_device(torch.tensor(1.0)) is None  # a plain tensor: no collective at all
    assert batching.norm_device(_OffloadedNorm(torch.tensor(1.0))).type == "cuda"
    same = SimpleNamespace(device=torch.device("cpu"), device_mesh=SimpleNamespace(device_type="cpu"))
    assert batching.norm_device(same) is None  # a gloo/CPU mesh keeps it where it is


def test_offloaded_norm_is_moved_before_clipping(monkeypatch):
    model = torch.nn.Linear(4, 3)
    model(torch.randn(5, 4)).square().sum().backward()
    fake = _OffloadedNorm(torch.tensor(7.0))
    seen = {}
    monkeypatch.setattr(torch.nn.utils, "get_total_norm", lambda grads: fake)
    monkeypatch.setattr(torch.nn.utils, "clip_grads_with_norm_",
                        lambda params, max_norm, total: seen.setdefault("total", total))
    out = batching.clip_grad_norm(list(model.parameters()), 1.0)
    assert [d.type for d in fake.moved_to] == ["cuda"]
    assert seen["total"] is fake.value and out is fake.value  # clipping and the reported norm use the moved one


def test_same_numbers_as_torch_clip_grad_norm():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    b.load_state_dict(a.state_dict())
    x = torch.randn(4, 8)
    for m in (a, b):
        (m(x) * 100).square().sum().backward()
    ref = torch.nn.utils.clip_grad_norm_(list(a.parameters()), 0.5)
    got = batching.clip_grad_norm(list(b.parameters()), 0.5)
    assert torch.equal(ref, got)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p.grad, q.grad)
