"""The multi-rank code paths on a 1-rank NCCL group: what a single lent GPU can show of them.

Alone, hpcppo skips its collectives (``all_reduce_host`` returns the numbers, ``iter_full_params`` reads whole
shards) and torch skips DTensor's (a redistribution over a mesh dimension of size 1 is a local no-op:
``torch/distributed/tensor/_redistribute.py``, "if num_chunks == 1", torch 2.11-2.13). So a 1-GPU check runs them
on purpose:

* ``collective_device()`` is ``cuda:<local_rank>`` on an NCCL group and ``all_reduce_host(force_collective=True)``
  moves float64 numbers through NCCL's all-reduce and back, exactly;
* ``iter_full_params(force_gather=True)`` streams the FSDP2-sharded tiny Llama (on the GPU and CPU-offloaded,
  gathered in bf16, into buckets and straight into the consumer's tensors) through NCCL's all-gather, and every
  tensor equals the parameter;
* ``batching.clip_grad_norm`` on CPU-offloaded FSDP2 gradients clips to the unsharded model's norm, returns the
  norm on the GPU, and the all-reduce that 2+ ranks run on it (DTensor's Partial -> Replicate) goes through NCCL
  there, while the same all-reduce of the norm where torch computes it (host memory) is refused by NCCL, which is
  why ``norm_device`` moves it.

The measurements run in a child process (``python tests/gpu/test_one_rank_paths.py paths OUT_DIR``) and the tests
judge its ``result-0.pt``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from _gpu_launch import cuda_device_count, run_scenario, scenario_main

HOST_VALUES = [1.0, 2.0**53, -3.5, 0.1]
GATHERS = ("all_gather_into_tensor", "all_gather_single", "broadcast")


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict[str, Any]:
    cuda_device_count()
    (r,) = run_scenario("paths", 1, tmp_path_factory.mktemp("paths"), timeout_s=180, script=Path(__file__).resolve())
    return r


def test_host_reduction_runs_nccl_on_the_collective_device(result):
    r = result
    assert (r["backend"], r["world"]) == ("nccl", 1), r
    assert r["collective_device"] == "cuda:0", r
    for op in ("sum", "mean", "max", "min"):
        assert r[f"host_{op}"] == HOST_VALUES, (op, r[f"host_{op}"])  # float64 both ways: 2**53 and 0.1 exact
        assert r[f"host_calls_{op}"] == [("all_reduce", "cuda", "torch.float64")], r[f"host_calls_{op}"]
    assert r["host_calls_unforced"] == [], "without force_collective one rank reduces nothing"


@pytest.mark.parametrize("offload", [False, True], ids=["on-gpu", "cpu-offload"])
def test_bucketed_and_in_place_gathers_run_nccl(result, offload):
    g = result["gather"][offload]
    assert g["local_devices"] == (["cpu"] if offload else ["cuda"]), g
    for path in ("bucket", "into"):
        case = g[path]
        assert case["names"] == g["names"], (path, case["names"])
        assert case["exact"], f"{path}: a streamed tensor differs from its parameter (cast to bf16)"
        assert case["calls"], f"{path}: no collective ran: the 1-rank shortcut was taken"
        # NCCL gathers on the GPU, also from CPU-offloaded shards, in the dtype asked for
        assert {(c[1], c[2]) for c in case["calls"]} == {("cuda", "torch.bfloat16")}, case["calls"]
        assert {c[0] for c in case["calls"]} <= set(GATHERS[:2]), case["calls"]
    assert len(g["bucket"]["calls"]) < len(g["names"]), "small parameters share a bucket's collective"
    assert g["into"]["in_place"] == g["names"], "every target fits: each is gathered straight into it"


def test_clip_grad_norm_with_offloaded_gradients(result):
    c = result["clip"]
    assert c["grad_devices"] == ["cpu"] and c["mesh_device"] == "cuda", c
    assert c["torch_norm_device"] == "cpu", c  # where get_total_norm leaves it: the shards' device
    assert c["norm_device"] == "cuda", "clip_grad_norm must reduce the norm on the mesh's device"
    assert abs(c["norm"] - c["ref_norm"]) <= 1e-4 * c["ref_norm"], c
    assert c["ref_norm"] > 10 * c["max_norm"], "the gradients must be large enough to be clipped"
    assert c["clipped_max_err"] <= 1e-5 * c["clipped_max_abs"], c
    assert c["moved_reduce"] == pytest.approx(c["norm"] ** 2, rel=1e-5), c
    assert "cpu" in c["host_reduce_error"].lower(), f"NCCL accepted a host tensor: {c['host_reduce_error']!r}"


# --------------------------------------------------------------------------------------------- child process
def _recorder(dist: Any, names: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """Record (name, device type, dtype) of every call of ``dist.<name>`` from now on, then run the real one."""
    calls: list[tuple[str, str, str]] = []
    for name in names:
        real = getattr(dist, name, None)
        if real is None:
            continue

        def recording(tensor: Any, *args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls.append((_name, tensor.device.type, str(tensor.dtype)))
            return _real(tensor, *args, **kwargs)

        setattr(dist, name, recording)
    return calls


def _gather_case(mesh: Any, device: Any, calls: list, *, offload: bool) -> dict[str, Any]:
    import torch

    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.weights import clean_name, iter_full_params
    from hpcppo.tiny import TinySettings, build_model, build_tokenizer

    model = build_model(build_tokenizer(), TinySettings()).to(device)
    apply_fsdp(model, mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cpu_offload=offload,
               reshard_after_forward=True)
    want = {clean_name(n): p.to_local().detach().to("cpu", torch.bfloat16) for n, p in model.named_parameters()}
    r: dict[str, Any] = {"names": list(want),
                         "local_devices": sorted({p.to_local().device.type for p in model.parameters()})}
    calls.clear()
    got = [(n, t.to("cpu", copy=True)) for n, t in iter_full_params(model, dtype=torch.bfloat16, force_gather=True)]
    r["bucket"] = {"names": [n for n, _ in got], "calls": list(calls),
                   "exact": all(torch.equal(t, want[n]) for n, t in got)}
    targets = {n: torch.empty(t.shape, dtype=torch.bfloat16, device=device) for n, t in want.items()}
    calls.clear()
    got = list(iter_full_params(model, dtype=torch.bfloat16, into=targets, direct_min_bytes=0, force_gather=True))
    r["into"] = {"names": [n for n, _ in got], "calls": list(calls),
                 "exact": all(torch.equal(t.cpu(), want[n]) for n, t in got),
                 "in_place": [n for n, t in got if t is targets[n]]}
    return r


def _clip_case(mesh: Any, device: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.tiny import TinySettings, build_model, build_tokenizer
    from hpcppo.train.batching import clip_grad_norm

    tokenizer = build_tokenizer()
    reference = build_model(tokenizer, TinySettings()).to(device)  # seeded: the same weights as `model`
    model = build_model(tokenizer, TinySettings()).to(device)
    apply_fsdp(model, mesh, param_dtype=None, reduce_dtype=None, cpu_offload=True, reshard_after_forward=True)
    ids = torch.randint(8, 60, (4, 24), generator=torch.Generator().manual_seed(5)).to(device)
    for m in (reference, model):
        logits = m(input_ids=ids, use_cache=False).logits
        (100 * torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())).backward()
    max_norm = 0.5
    r: dict[str, Any] = {"max_norm": max_norm, "mesh_device": mesh.device_type}
    ref_norm = torch.nn.utils.clip_grad_norm_(list(reference.parameters()), max_norm)
    params = [p for p in model.parameters() if p.grad is not None]
    r["grad_devices"] = sorted({p.grad.to_local().device.type for p in params})
    r["torch_norm_device"] = torch.nn.utils.get_total_norm([p.grad for p in params]).device.type
    total = clip_grad_norm(params, max_norm)
    r["norm_device"] = total.device.type
    r["norm"], r["ref_norm"] = float(total.full_tensor()), float(ref_norm)
    ref_grads = dict(reference.named_parameters())
    errs, scale = [], []
    for name, p in model.named_parameters():
        ref = ref_grads[name].grad.float().cpu()
        errs.append(float((p.grad.full_tensor().float().cpu() - ref).abs().max()))
        scale.append(float(ref.abs().max()))
    r["clipped_max_err"], r["clipped_max_abs"] = max(errs), max(scale)
    # What DTensor runs on 2+ ranks to turn the partial norm into the total (skipped on one): an all-reduce of the
    # local partial value (the square of the 2-norm) over the mesh's group, on the device the norm is on.
    group = mesh.get_group(0)
    moved = total.to_local().detach().float().pow(2).contiguous()
    dist.all_reduce(moved, group=group)
    r["moved_reduce"] = float(moved)
    host = torch.nn.utils.get_total_norm([p.grad for p in params]).to_local().detach().pow(2).contiguous()
    try:
        dist.all_reduce(host, group=group)
        r["host_reduce_error"] = ""
    except RuntimeError as exc:
        r["host_reduce_error"] = str(exc)
    return r


def scenario_paths(out_dir: Path) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from hpcppo.distributed.env import all_reduce_host, collective_device, detect_env, init_distributed
    from hpcppo.distributed.mesh import build_mesh

    env = detect_env(os.environ, device_type=os.environ.get("HPCPPO_GPU_SCENARIO_DEVICE", "cuda"))
    init_distributed(env, timeout_s=120)
    device = torch.device("cuda", env.local_rank) if env.device_type == "cuda" else torch.device("cpu")
    calls = _recorder(dist, ("all_reduce", *GATHERS))
    r: dict[str, Any] = {"backend": dist.get_backend(), "world": dist.get_world_size(),
                         "collective_device": str(collective_device())}
    for op in ("sum", "mean", "max", "min"):
        calls.clear()
        r[f"host_{op}"] = all_reduce_host(HOST_VALUES, op, force_collective=True)
        r[f"host_calls_{op}"] = list(calls)
    calls.clear()
    all_reduce_host(HOST_VALUES, "sum")
    r["host_calls_unforced"] = list(calls)
    mesh = build_mesh(env.device_type, env.world_size, 1, hsdp=False)
    r["gather"] = {offload: _gather_case(mesh, device, calls, offload=offload) for offload in (False, True)}
    r["clip"] = _clip_case(mesh, device)
    return r


if __name__ == "__main__":
    sys.exit(scenario_main(sys.argv[1:], "paths", scenario_paths))
