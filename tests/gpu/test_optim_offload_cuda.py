"""optimizer_offload on a CUDA GPU: the AdamW state (FSDP2 DTensor shards) leaves the GPU for pinned host memory,
the allocator hands the memory back, the state comes back for the steps, and N updates with offload equal N
updates without, bit for bit; a DCP checkpoint written from host-resident state resumes.

The measurements run in a child process (``python tests/gpu/test_optim_offload_cuda.py OUT_DIR``: a fresh CUDA
context and a 1-rank NCCL group that cannot leak into other checks); it saves ``OUT_DIR/result-0.pt`` and the tests
assert on it. ``HPCPPO_GPU_SCENARIO_DEVICE=cpu`` runs the child on gloo/CPU, only to check this file on a machine
without a GPU (memory and pinning figures are then absent); the tests never set it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from _gpu_launch import cuda_device_count, run_processes

UPDATES, STEPS_PER_UPDATE = 3, 2
WIDTH, DEPTH = 2048, 4  # 4 x 16 MiB fp32 weights: every moment is one >= 10 MiB allocation with its own segment
MOMENTS = ("exp_avg", "exp_avg_sq")


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict[str, Any]:
    cuda_device_count()
    import torch

    out = tmp_path_factory.mktemp("optim-offload")
    # Deterministic cuBLAS (and torch.use_deterministic_algorithms in the child): two tracks must match bit for bit.
    run_processes([sys.executable, str(Path(__file__).resolve()), str(out)], 1, out, "optim-offload",
                  timeout_s=240, extra_env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    return torch.load(out / "result-0.pt", weights_only=True)


def test_offload_frees_the_state_bytes_on_the_gpu_into_pinned_host_memory(result):
    r = result
    assert r["device_type"] == "cuda" and r["all_dtensor"], r
    state = r["state_bytes"]
    assert state == 2 * DEPTH * WIDTH * WIDTH * 4 and r["offload_returned"] == state, r
    assert r["allocated_before"] - r["allocated_offloaded"] >= state, r
    # empty_cache after the offload: the blocks go back to the driver, where a colocated vLLM can take them.
    assert r["reserved_before"] - r["reserved_offloaded"] >= state, r
    assert r["moment_devices_offloaded"] == ["cpu"] and r["all_pinned"], r
    assert r["placements_kept"] and r["values_kept_offloaded"], r
    assert r["step_devices"] == ["cpu"] and r["step_dtypes"] == ["torch.float32"], r  # AdamW reads step on the host


def test_load_brings_the_state_back_to_the_gpu(result):
    r = result
    assert r["load_returned"] == r["state_bytes"], r
    assert r["allocated_loaded"] - r["allocated_offloaded"] >= r["state_bytes"], r
    assert r["moment_devices_loaded"] == ["cuda"] and r["values_kept_loaded"] and r["placements_kept"], r


def test_updates_with_offload_equal_updates_without_bit_for_bit(result):
    r = result
    assert r["steps_run"] == UPDATES * STEPS_PER_UPDATE, r
    assert r["params_equal"] and r["moments_equal"] and r["params_moved"], r
    # Between updates the offloaded track's state rests on the host: after every update the GPU holds at least
    # the state's bytes less than the plain track does (both measured against their own freshly built model).
    assert r["moment_devices_between_updates"] == ["cpu"], r
    for plain, offloaded in zip(r["held_between_updates_plain"], r["held_between_updates_offloaded"], strict=True):
        assert plain - offloaded >= r["state_bytes"], r


def test_checkpoint_from_host_state_resumes(result):
    r = result
    # DCP loads the state onto the parameters' device: that is why Trainer.maybe_resume offloads after loading.
    assert r["moment_devices_after_dcp_load"] == ["cuda"], r
    assert r["resumed_moments_equal"] and r["resumed_moment_devices"] == ["cpu"] and r["resumed_pinned"], r
    assert r["resumed_step_equal"], r


# --------------------------------------------------------------------------------------------- child process
DEVICE = os.environ.get("HPCPPO_GPU_SCENARIO_DEVICE", "cuda")


def _build(mesh: Any, device: Any) -> tuple[Any, Any]:
    import torch
    from torch import nn

    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.train.optim import build_optimizer

    class Stack(nn.Module):  # [B, WIDTH] -> [B, WIDTH]; apply_fsdp shards each block of the ModuleList, then the root
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH, bias=False), nn.Tanh())
                                        for _ in range(DEPTH))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = x + block(x)
            return x

    torch.manual_seed(0)
    model = Stack().to(device)
    apply_fsdp(model, mesh, param_dtype=None, reduce_dtype=None, cpu_offload=False, reshard_after_forward=True)
    return model, build_optimizer(model, lr=1e-3, weight_decay=0.01, betas=(0.9, 0.999))


def _backward(model: Any, i: int, device: Any) -> None:
    import torch

    x = torch.randn(64, WIDTH, generator=torch.Generator().manual_seed(1000 + i)).to(device)
    model(x).pow(2).mean().backward()


def _moments(opt: Any) -> list[Any]:
    return [s[k] for s in opt.state.values() for k in MOMENTS]


def _locals(tensors: list[Any]) -> list[Any]:
    return [t.to_local() for t in tensors]


def _devices(tensors: list[Any]) -> list[str]:
    return sorted({t.to_local().device.type for t in tensors})


def _mem(device: Any) -> tuple[int | None, int | None]:
    import torch

    if device.type != "cuda":
        return None, None
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)


def _train(model: Any, opt: Any, device: Any, *, offload: bool) -> dict[str, Any]:
    """UPDATES updates of STEPS_PER_UPDATE steps, as Trainer.update_actor runs them, with a forward between
    updates (the rollout / log-prob phases); returns the steps run and what lay where between updates."""
    import torch

    from hpcppo.train.optim import OptimizerStateOffload

    built, _ = _mem(device)
    steps, grown, devices = 0, [], set()
    for u in range(UPDATES):
        view = OptimizerStateOffload(opt, enabled=offload)
        for s in range(STEPS_PER_UPDATE):
            _backward(model, u * STEPS_PER_UPDATE + s, device)
            view.before_step()
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps += 1
        view.after_update()
        with torch.no_grad():
            model(torch.ones(8, WIDTH, device=device))
        allocated, _ = _mem(device)
        grown.append(None if built is None else allocated - built)  # bytes held since the model was built
        devices |= set(_devices(_moments(opt)))
    return {"steps": steps, "grown": grown, "devices": sorted(devices)}


def scenario(out_dir: Path) -> dict[str, Any]:
    import torch
    from torch.distributed.tensor import DTensor

    from hpcppo.distributed.checkpoint import CheckpointManager
    from hpcppo.distributed.env import detect_env, init_distributed
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.train.optim import load_optimizer_state, offload_optimizer_state

    torch.use_deterministic_algorithms(True, warn_only=True)  # the equality checks are the judge
    env = detect_env(os.environ, device_type=DEVICE)
    init_distributed(env, timeout_s=120)
    device = torch.device("cuda", env.local_rank) if env.device_type == "cuda" else torch.device("cpu")
    mesh = build_mesh(env.device_type, env.world_size, 1, hsdp=False)
    r: dict[str, Any] = {"device_type": device.type}

    # --- one offload/load round trip, measured
    model, opt = _build(mesh, device)
    _backward(model, 0, device)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the state gets fresh segments of its own, so releasing it is measurable
    opt.step()
    opt.zero_grad(set_to_none=True)
    moments = _moments(opt)
    r["all_dtensor"] = all(isinstance(t, DTensor) for t in moments)
    r["state_bytes"] = sum(t.numel() * t.element_size() for t in _locals(moments))
    reference = [t.detach().cpu().clone() for t in _locals(moments)]
    layout = [(t.device_mesh, t.placements, t.shape, t.stride()) for t in moments]
    r["allocated_before"], r["reserved_before"] = _mem(device)
    t0 = time.perf_counter()
    r["offload_returned"] = offload_optimizer_state(opt)
    r["offload_s"] = time.perf_counter() - t0
    r["allocated_offloaded"], r["reserved_offloaded"] = _mem(device)
    moments = _moments(opt)
    r["moment_devices_offloaded"] = _devices(moments)
    r["all_pinned"] = all(t.to_local().is_pinned() for t in moments) if device.type == "cuda" else None
    r["values_kept_offloaded"] = all(torch.equal(a.cpu(), b) for a, b in zip(_locals(moments), reference))
    steps = [s["step"] for s in opt.state.values()]
    r["step_devices"] = sorted({s.device.type for s in steps})
    r["step_dtypes"] = sorted({str(s.dtype) for s in steps})
    t0 = time.perf_counter()
    r["load_returned"] = load_optimizer_state(opt)
    r["load_s"] = time.perf_counter() - t0
    r["allocated_loaded"], _ = _mem(device)
    moments = _moments(opt)
    r["moment_devices_loaded"] = _devices(moments)
    r["values_kept_loaded"] = all(torch.equal(a.cpu(), b) for a, b in zip(_locals(moments), reference))
    r["placements_kept"] = [(t.device_mesh, t.placements, t.shape, t.stride()) for t in moments] == layout
    del model, opt, moments

    # --- N updates with offload between them vs without, from the same start, bit for bit
    plain_model, plain_opt = _build(mesh, device)
    start = [p.to_local().detach().clone() for p in plain_model.parameters()]
    plain = _train(plain_model, plain_opt, device, offload=False)
    model, opt = _build(mesh, device)
    offloaded = _train(model, opt, device, offload=True)
    r["steps_run"] = offloaded["steps"]
    r["moment_devices_between_updates"] = offloaded["devices"]
    r["held_between_updates_plain"], r["held_between_updates_offloaded"] = plain["grown"], offloaded["grown"]
    pairs = list(zip(plain_model.parameters(), model.parameters(), strict=True))
    r["params_equal"] = all(torch.equal(a.to_local(), b.to_local()) for a, b in pairs)
    r["params_moved"] = all(not torch.equal(a.to_local(), s) for (a, _), s in zip(pairs, start))
    load_optimizer_state(opt)  # compare on one device
    r["moments_equal"] = all(torch.equal(a, b) for a, b in
                             zip(_locals(_moments(plain_opt)), _locals(_moments(opt)), strict=True))
    del plain_model, plain_opt

    # --- a checkpoint written while the state sits on the host, resumed the way Trainer.maybe_resume does
    offload_optimizer_state(opt)
    saved = [t.detach().clone() for t in _locals(_moments(opt))]
    manager = CheckpointManager(out_dir / "ckpt", keep_last=0, rank=env.rank, world_size=env.world_size)
    manager.save(1, models={"m": model}, optimizers={"m": opt}, extra={"step": 1}, save_rng=False)
    fresh_model, fresh_opt = _build(mesh, device)
    manager.load(1, models={"m": fresh_model}, optimizers={"m": fresh_opt}, restore_rng=False)
    r["moment_devices_after_dcp_load"] = _devices(_moments(fresh_opt))
    offload_optimizer_state(fresh_opt)
    resumed = _moments(fresh_opt)
    r["resumed_moment_devices"] = _devices(resumed)
    r["resumed_pinned"] = all(t.to_local().is_pinned() for t in resumed) if device.type == "cuda" else None
    r["resumed_moments_equal"] = all(torch.equal(a, b) for a, b in zip(saved, _locals(resumed), strict=True))
    # one more update on both: same parameters afterwards
    for m, o in ((model, opt), (fresh_model, fresh_opt)):
        load_optimizer_state(o)
        _backward(m, 99, device)
        o.step()
        o.zero_grad(set_to_none=True)
    r["resumed_step_equal"] = all(torch.equal(a.to_local(), b.to_local()) for a, b in
                                  zip(model.parameters(), fresh_model.parameters(), strict=True))
    r["offload_gb_s"] = r["state_bytes"] / r["offload_s"] / 1e9
    r["load_gb_s"] = r["state_bytes"] / r["load_s"] / 1e9
    # Plain types only (the test loads with weights_only=True).
    return {k: (str(v) if isinstance(v, torch.dtype) else v) for k, v in r.items()}


def _main(argv: list[str]) -> int:
    import torch

    from hpcppo.distributed.env import destroy_distributed

    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        r = scenario(out_dir)
        print({k: r[k] for k in ("state_bytes", "offload_s", "load_s", "offload_gb_s", "load_gb_s")}, flush=True)
        tmp = out_dir / ".result-0.pt.tmp"
        torch.save(r, tmp)
        os.replace(tmp, out_dir / "result-0.pt")
    finally:
        destroy_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
