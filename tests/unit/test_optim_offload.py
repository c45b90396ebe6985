"""Optimizer-state offload (verl's ``optimizer_offload``) on a 1-rank gloo mesh with FSDP2 DTensor states.

On the CPU the "device" and the host are the same memory, so these tests check what can be checked here for
real: every moved state tensor gets fresh storage, values stay bit-identical, DTensors keep mesh, placements and
global shape/stride, AdamW's scalar ``step`` stays where AdamW keeps it, training with offload between steps equals
training without, and DCP checkpoints written from offloaded state resume. tests/gpu/test_optim_offload_cuda.py
checks the memory actually leaving the GPU.
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from hpcppo.train.optim import OptimizerStateOffload, load_optimizer_state, offload_optimizer_state

MOMENTS = ("exp_avg", "exp_avg_sq")


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    """A 1-rank gloo process group (file store, short timeout) and its CPU device mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    assert not dist.is_initialized(), "another test left a process group behind"
    store = dist.FileStore(str(tmp_path_factory.mktemp("pg") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


class Tiny(nn.Module):
    """[B, T] ids -> [B, T, 11] logits; uneven dims (7, 11) so shapes and strides are not all alike."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(13, 7)
        # Linear + Tanh per block: an FSDP2 module must not return a view (its backward hook would be skipped).
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(7, 7), nn.Tanh()) for _ in range(2)])
        self.head = nn.Linear(7, 11, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def _build(mesh, *, fsdp: bool = True, **adamw) -> tuple[nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Tiny()
    if fsdp:
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    kw = {"lr": 1e-2, "weight_decay": 0.01, "foreach": True} | adamw
    return model, torch.optim.AdamW(model.parameters(), **kw)


def _batch(i: int) -> torch.Tensor:
    return torch.randint(0, 13, (3, 5), generator=torch.Generator().manual_seed(100 + i))


def _backward(model: nn.Module, i: int) -> None:
    model(_batch(i)).float().pow(2).mean().backward()


def _step(model: nn.Module, opt: torch.optim.Optimizer, i: int) -> None:
    _backward(model, i)
    opt.step()
    opt.zero_grad(set_to_none=True)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _state_snapshot(opt: torch.optim.Optimizer) -> dict[tuple[int, str], dict]:
    """Per (param index, key): the object, a clone of its local values, and its layout."""
    out = {}
    params = [p for g in opt.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        for key, value in opt.state.get(p, {}).items():
            entry = {"obj": value, "value": value}
            if isinstance(value, torch.Tensor):
                entry |= {"value": _local(value).clone(), "ptr": _local(value).data_ptr(), "dtype": value.dtype,
                          "shape": value.shape, "stride": value.stride(), "device": _local(value).device,
                          "dtensor": isinstance(value, DTensor)}
                if isinstance(value, DTensor):
                    entry |= {"mesh": value.device_mesh, "placements": value.placements,
                              "local_shape": value.to_local().shape}
            out[(i, key)] = entry
    return out


def _assert_same_values_new_storage(before: dict, opt: torch.optim.Optimizer, moved_keys: tuple[str, ...]) -> None:
    after = _state_snapshot(opt)
    assert after.keys() == before.keys()
    for (i, key), old in before.items():
        new = after[(i, key)]
        if not isinstance(old["obj"], torch.Tensor):
            assert new["obj"] is old["obj"], key  # non-tensor state is left alone
            continue
        assert torch.equal(new["value"], old["value"]) and new["value"].dtype == old["dtype"], (i, key)
        for field in ("dtype", "shape", "stride", "device", "dtensor"):
            assert new[field] == old[field], (i, key, field)
        if old["dtensor"]:
            assert new["mesh"] == old["mesh"] and new["placements"] == old["placements"], (i, key)
            assert new["local_shape"] == old["local_shape"], (i, key)
        if key in moved_keys:
            assert new["obj"] is not old["obj"] and new["ptr"] != old["ptr"], f"{key} of param {i} was not moved"
        else:
            assert new["obj"] is old["obj"], f"{key} of param {i} should not move"


def _moment_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(_local(s[k]).numel() * _local(s[k]).element_size() for s in opt.state.values() for k in MOMENTS)


def test_round_trip_is_bit_exact_keeps_dtensors_and_leaves_step(mesh):
    model, opt = _build(mesh)
    for i in range(2):
        _step(model, opt, i)
    some_state = next(iter(opt.state.values()))
    assert isinstance(some_state["exp_avg"], DTensor)  # the FSDP2 case is the one under test
    before = _state_snapshot(opt)
    assert offload_optimizer_state(opt) == _moment_bytes(opt) > 0
    _assert_same_values_new_storage(before, opt, MOMENTS)
    for state in opt.state.values():
        # AdamW (not capturable/fused) keeps step as a float32 CPU scalar and reads it on the host.
        assert state["step"].device.type == "cpu" and state["step"].dtype == torch.float32
        assert float(state["step"]) == 2.0
    before = _state_snapshot(opt)
    assert load_optimizer_state(opt) == _moment_bytes(opt)
    _assert_same_values_new_storage(before, opt, MOMENTS)
    params = [p for g in opt.param_groups for p in g["params"]]
    for p in params:
        for key in MOMENTS:
            assert _local(opt.state[p][key]).device == _local(p).device


def test_fused_adamw_moves_step_with_the_moments(mesh):
    """fused/capturable AdamW keeps ``step`` on the parameter's device, so there it travels too."""
    model, opt = _build(mesh, fsdp=False, foreach=None, fused=True)
    _step(model, opt, 0)
    before = _state_snapshot(opt)
    offload_optimizer_state(opt)
    _assert_same_values_new_storage(before, opt, MOMENTS + ("step",))


def test_empty_state_and_non_tensor_state(mesh):
    model, opt = _build(mesh)
    assert offload_optimizer_state(opt) == 0 and load_optimizer_state(opt) == 0
    assert len(opt.state) == 0  # no entries created by looking (the state is a defaultdict)
    _step(model, opt, 0)  # AdamW creates its state lazily, on the parameters' device
    first = next(iter(opt.state))
    opt.state[first]["note"] = "kept"  # optimizers may keep non-tensor state; it must survive untouched
    before = _state_snapshot(opt)
    offload_optimizer_state(opt)
    load_optimizer_state(opt)
    after = _state_snapshot(opt)
    assert after.keys() == before.keys() and opt.state[first]["note"] == "kept"


def test_pinning_needs_a_host_target(mesh):
    model, opt = _build(mesh, fsdp=False)
    _step(model, opt, 0)
    with pytest.raises(ValueError, match="pin=True needs a host target device, got meta"):
        offload_optimizer_state(opt, "meta", pin=True)


def _train(mesh, *, offload: bool, updates: int = 3, minis: int = 2) -> tuple[nn.Module, torch.optim.Optimizer]:
    """``updates`` updates of ``minis`` optimizer steps each, as the trainer runs them, with or without offload."""
    model, opt = _build(mesh)
    for u in range(updates):
        state = OptimizerStateOffload(opt, enabled=offload)
        for m in range(minis):
            _backward(model, u * minis + m)
            state.before_step()
            opt.step()
            opt.zero_grad(set_to_none=True)
        state.after_update()
        # between updates: a forward pass as the rollout/log-prob phases would run
        with torch.no_grad():
            model(_batch(99))
    return model, opt


def test_training_with_offload_between_updates_equals_training_without(mesh):
    ref_model, ref_opt = _train(mesh, offload=False)
    model, opt = _train(mesh, offload=True)
    for (name, a), (_, b) in zip(ref_model.named_parameters(), model.named_parameters(), strict=True):
        assert torch.equal(_local(a), _local(b)), name
    ref_state, state = _state_snapshot(ref_opt), _state_snapshot(opt)
    assert ref_state.keys() == state.keys()
    for key, entry in ref_state.items():
        assert torch.equal(entry["value"], state[key]["value"]), key


def test_step_offload_load_step_equals_step_step(mesh):
    ref_model, ref_opt = _build(mesh)
    model, opt = _build(mesh)
    _step(ref_model, ref_opt, 0)
    _step(ref_model, ref_opt, 1)
    _step(model, opt, 0)
    offload_optimizer_state(opt)
    load_optimizer_state(opt)
    _step(model, opt, 1)
    for (name, a), (_, b) in zip(ref_model.named_parameters(), model.named_parameters(), strict=True):
        assert torch.equal(_local(a), _local(b)), name
    for (k, e), (_, f) in zip(_state_snapshot(ref_opt).items(), _state_snapshot(opt).items(), strict=True):
        assert torch.equal(e["value"], f["value"]), k


def test_update_view_loads_once_and_offloads_only_what_it_loaded(mesh):
    model, opt = _build(mesh)
    _step(model, opt, 0)
    offload_optimizer_state(opt)
    resting = _state_snapshot(opt)

    disabled = OptimizerStateOffload(opt, enabled=False)
    disabled.before_step()
    disabled.after_update()
    _assert_same_values_new_storage(resting, opt, moved_keys=())

    idle = OptimizerStateOffload(opt, enabled=True)
    idle.after_update()  # an update that never stepped: nothing was loaded, nothing moves
    _assert_same_values_new_storage(resting, opt, moved_keys=())

    view = OptimizerStateOffload(opt, enabled=True)
    view.before_step()
    _assert_same_values_new_storage(resting, opt, MOMENTS)
    loaded = _state_snapshot(opt)
    view.before_step()  # later mini-batches of the same update: already on the device
    _assert_same_values_new_storage(loaded, opt, moved_keys=())
    view.after_update()
    _assert_same_values_new_storage(loaded, opt, MOMENTS)


def test_checkpoint_of_offloaded_state_resumes_bit_exact(mesh, tmp_path):
    """DCP saves the state while it sits on the host; a resume restores it and it can go back to the host."""
    from hpcppo.distributed.checkpoint import CheckpointManager

    model, opt = _build(mesh)
    _step(model, opt, 0)
    _step(model, opt, 1)
    offload_optimizer_state(opt)
    saved = _state_snapshot(opt)
    manager = CheckpointManager(tmp_path / "ckpt", keep_last=0, rank=0, world_size=1)
    manager.save(2, models={"m": model}, optimizers={"m": opt}, extra={"step": 2}, save_rng=False)

    fresh_model, fresh_opt = _build(mesh)
    torch.manual_seed(123)
    manager.load(2, models={"m": fresh_model}, optimizers={"m": fresh_opt}, restore_rng=False)
    offload_optimizer_state(fresh_opt)  # what Trainer.maybe_resume does with optimizer_offload
    restored = _state_snapshot(fresh_opt)
    assert restored.keys() == saved.keys()
    for key, entry in saved.items():
        got = restored[key]
        assert torch.equal(entry["value"], got["value"]) and got["dtensor"] == entry["dtensor"], key
        if entry["dtensor"]:
            assert got["placements"] == entry["placements"] and got["shape"] == entry["shape"], key
    # One more step from the restored state equals one more step of the original.
    load_optimizer_state(opt)
    load_optimizer_state(fresh_opt)
    _step(model, opt, 2)
    _step(fresh_model, fresh_opt, 2)
    for (name, a), (_, b) in zip(model.named_parameters(), fresh_model.named_parameters(), strict=True):
        assert torch.equal(_local(a), _local(b)), name
