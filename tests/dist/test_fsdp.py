"""FSDP2 on real gloo ranks against a single process on the full batch, plus weight streaming out of FSDP.

One 2-rank spawn runs every scenario and returns measurements; the tests below assert on them (spawning costs
~5 s of imports, so the scenarios share it). HSDP needs 4 ranks and gets its own spawn.
"""

from __future__ import annotations

import pytest
import torch
from _models import Critic, PlainStack, batch, lm_loss, tiny_lm
from _spawn import run_distributed

TOL = 1e-6


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    # full_tensor() on a 1-rank mesh returns the local shard itself: clone so later updates don't show through.
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def _reference_step(ids: torch.Tensor) -> dict:
    """One process, full batch: loss, clipped grads, params after one AdamW step, logits after it."""
    model = tiny_lm()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = lm_loss(model, ids)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    opt.step()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return {"loss": loss.item(), "norm": norm.item(), "grads": grads, "params": params, "logits": logits}


def _sharded_step(mesh, ids_local, *, ac: bool = False, **fsdp_kw):
    from hpcppo.distributed.fsdp import apply_activation_checkpointing, apply_fsdp

    kw = {"param_dtype": None, "reduce_dtype": None, "cpu_offload": False, "reshard_after_forward": True} | fsdp_kw
    model = tiny_lm()
    if ac:
        apply_activation_checkpointing(model)
    apply_fsdp(model, mesh, **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    saved: list[int] = []  # elements autograd keeps for backward; checkpointed layers keep only their inputs

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = lm_loss(model, ids_local)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    grads = {n: _full(p.grad) for n, p in model.named_parameters()}
    opt.step()
    params = {n: _full(p.detach()) for n, p in model.named_parameters()}
    return model, {"loss": loss.item(), "norm": _full(norm).item(), "grads": grads, "params": params,
                   "saved_numel": sum(saved)}


def _compare(ref: dict, got: dict) -> dict:
    return {"grad_diff": _max_diff(ref["grads"], got["grads"]), "param_diff": _max_diff(ref["params"], got["params"]),
            "norm_diff": abs(ref["norm"] - got["norm"]), "loss": got["loss"], "saved_numel": got["saved_numel"]}


def _fsdp_worker(rank: int, world: int) -> dict:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard

    from hpcppo.distributed.fsdp import apply_activation_checkpointing, apply_fsdp
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.distributed.weights import iter_full_params, load_into

    mesh = build_mesh("cpu", world, 1, hsdp=False)
    ids = batch(0, n=4)
    local = ids.chunk(world)[rank]
    ref = _reference_step(ids)
    out: dict = {"ref_loss": ref["loss"]}

    model, got = _sharded_step(mesh, local)
    out["fp32"] = _compare(ref, got)
    out["fsdp_units"] = sum(isinstance(m, FSDPModule) for m in model.modules())
    out["all_dtensor_shard0"] = all(isinstance(p, DTensor) and p.placements == (Shard(0),)
                                    for p in model.parameters())
    # Stream the trained FSDP weights into a plain model (different init) on every rank.
    plain = tiny_lm(seed=1)
    names = load_into(plain, iter_full_params(model))
    out["streamed_names"] = names
    with torch.no_grad():
        out["stream_after_step_logit_diff"] = (plain(input_ids=ids).logits - ref["logits"]).abs().max().item()
        out["stream_vs_fsdp_forward_equal"] = torch.equal(plain(input_ids=ids).logits, model(input_ids=ids).logits)

    _, got = _sharded_step(mesh, local, ac=True)
    out["ac"] = _compare(ref, got)
    _, got = _sharded_step(mesh, local, cpu_offload=True)
    out["offload"] = _compare(ref, got)
    _, got = _sharded_step(mesh, local, reshard_after_forward=False)
    out["no_reshard"] = _compare(ref, got)
    model, got = _sharded_step(mesh, local, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    out["bf16"] = _compare(ref, got) | {
        "finite": all(torch.isfinite(g).all().item() for g in got["grads"].values()),
        "master_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
    }

    # Streaming from a freshly sharded model must reproduce the original weights bit for bit.
    original = tiny_lm()
    with torch.no_grad():
        original_logits = original(input_ids=ids).logits
    sharded = apply_fsdp(tiny_lm(), mesh, param_dtype=None, reduce_dtype=None, cpu_offload=False,
                         reshard_after_forward=True)
    plain = tiny_lm(seed=2)
    load_into(plain, iter_full_params(sharded))
    with torch.no_grad():
        out["stream_exact_logits"] = torch.equal(plain(input_ids=ids).logits, original_logits)
    out["stream_exact_params"] = all(torch.equal(a, b) for a, b in zip(plain.parameters(), original.parameters()))
    # bf16 engine: cast before the gather.
    plain16 = tiny_lm(seed=2).to(torch.bfloat16)
    load_into(plain16, iter_full_params(sharded, dtype=torch.bfloat16))
    out["stream_bf16_exact"] = all(torch.equal(a, b.to(torch.bfloat16))
                                   for a, b in zip(plain16.parameters(), original.parameters()))
    # reshard_after_forward=False leaves gathered plain tensors registered after a no-grad forward (e.g. the
    # reference model's log-probs); streaming must still see the sharded DTensors, in the same order everywhere.
    kept = apply_fsdp(tiny_lm(), mesh, param_dtype=None, reduce_dtype=None, cpu_offload=False,
                      reshard_after_forward=False)
    with torch.no_grad():
        kept(input_ids=local)
    out["unsharded_after_forward"] = not all(isinstance(p, DTensor) for p in kept.parameters())
    plain = tiny_lm(seed=2)
    load_into(plain, iter_full_params(kept))
    out["stream_after_unsharded_forward_exact"] = all(
        torch.equal(a, b) for a, b in zip(plain.parameters(), original.parameters()))

    # Critic: HF backbone + value head; layers found through the backbone's _no_split_modules.
    critic_ref = Critic()
    values_ref = critic_ref(ids)
    (values_ref**2).mean().backward()
    critic = apply_fsdp(Critic(), mesh, param_dtype=None, reduce_dtype=None, cpu_offload=False,
                        reshard_after_forward=True)
    values = critic(local)
    (values**2).mean().backward()
    out["critic_fsdp_units"] = sum(isinstance(m, FSDPModule) for m in critic.modules())
    out["critic_value_diff"] = (values - values_ref.chunk(world)[rank]).abs().max().item()
    out["critic_grad_diff"] = _max_diff({n: p.grad for n, p in critic_ref.named_parameters()},
                                        {n: _full(p.grad) for n, p in critic.named_parameters()})

    # Non-HF model: torch's checkpoint wrapper, ModuleList discovery, wrapper prefixes stripped when streaming.
    stack_ids = ids % 32
    stack_ref = PlainStack()
    stack = PlainStack()
    apply_activation_checkpointing(stack)
    out["stack_wrapped_names"] = any("_checkpoint_wrapped_module" in n for n, _ in stack.named_parameters())
    apply_fsdp(stack, mesh, param_dtype=None, reduce_dtype=None, cpu_offload=False, reshard_after_forward=True)
    out["stack_fsdp_units"] = sum(isinstance(m, FSDPModule) for m in stack.modules())
    stack(stack_ids[:1]).sum().backward()
    target = PlainStack(seed=5)
    out["stack_streamed"] = load_into(target, iter_full_params(stack))
    with torch.no_grad():
        out["stack_stream_exact"] = torch.equal(target(stack_ids), stack_ref(stack_ids))
    return out


@pytest.fixture(scope="module")
def fsdp_results() -> list[dict]:
    return run_distributed(_fsdp_worker, 2)


def test_fsdp_matches_single_process_full_batch(fsdp_results):
    for r in fsdp_results:
        assert r["fsdp_units"] == 3  # two decoder layers + root
        assert r["all_dtensor_shard0"]
        assert r["fp32"]["grad_diff"] < TOL
        assert r["fp32"]["param_diff"] < TOL
        assert r["fp32"]["norm_diff"] < TOL
    # Each rank saw a different half of the batch: their losses differ, their mean is the full-batch loss.
    losses = [r["fp32"]["loss"] for r in fsdp_results]
    assert losses[0] != losses[1]
    assert abs(sum(losses) / 2 - fsdp_results[0]["ref_loss"]) < 1e-5


@pytest.mark.parametrize("variant", ["ac", "offload", "no_reshard"])
def test_fsdp_variants_are_exact(fsdp_results, variant):
    for r in fsdp_results:
        assert r[variant]["grad_diff"] < TOL, r[variant]
        assert r[variant]["param_diff"] < TOL, r[variant]
    if variant == "ac":  # the activations were really dropped, not just the flag set
        for r in fsdp_results:
            assert r["ac"]["saved_numel"] < 0.5 * r["fp32"]["saved_numel"], (r["ac"], r["fp32"])


def test_fsdp_bf16_mixed_precision_smoke(fsdp_results):
    for r in fsdp_results:
        bf16 = r["bf16"]
        assert bf16["finite"]
        assert bf16["master_dtypes"] == ["torch.float32"]  # sharded master weights stay fp32
        # bf16 compute is close to, but not the same as, fp32.
        assert 0 < bf16["grad_diff"] < 5e-2
        assert abs(bf16["loss"] - r["fp32"]["loss"]) < 2e-2


def test_critic_with_value_head_shards_backbone_layers(fsdp_results):
    for r in fsdp_results:
        assert r["critic_fsdp_units"] == 3
        assert r["critic_value_diff"] < TOL
        assert r["critic_grad_diff"] < TOL


def test_streaming_is_exact(fsdp_results):
    for r in fsdp_results:
        assert r["stream_exact_params"] and r["stream_exact_logits"] and r["stream_bf16_exact"]
        assert r["stream_vs_fsdp_forward_equal"]
        assert r["unsharded_after_forward"] and r["stream_after_unsharded_forward_exact"]
        assert r["stream_after_step_logit_diff"] < 1e-5
        assert "model.embed_tokens.weight" in r["streamed_names"]
        assert r["streamed_names"] == fsdp_results[0]["streamed_names"]  # same order on every rank


def test_generic_model_checkpoint_wrapper_and_name_stripping(fsdp_results):
    for r in fsdp_results:
        assert r["stack_wrapped_names"]
        assert r["stack_fsdp_units"] == 4  # three blocks + root
        assert r["stack_stream_exact"]
        assert all("_checkpoint_wrapped_module" not in n for n in r["stack_streamed"])
        assert "blocks.0.0.weight" in r["stack_streamed"]


def _stack_step(model: torch.nn.Module, ids: torch.Tensor, opt: torch.optim.Optimizer) -> dict:
    logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.roll(-1, dims=1).flatten())
    loss.backward()
    grads = {n: _full(p.grad) for n, p in model.named_parameters()}
    opt.step()
    return {"grads": grads, "params": {n: _full(p.detach()) for n, p in model.named_parameters()}}


def _hsdp_worker(rank: int, world: int) -> dict:
    # A non-HF model keeps the four processes free of the transformers import (seconds each on a busy machine).
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.distributed.weights import iter_full_params, load_into

    mesh = build_mesh("cpu", world, 2, hsdp=True)  # two emulated nodes of two ranks
    ids = batch(0, n=8) % 32
    ref_model = PlainStack()
    ref = _stack_step(ref_model, ids, torch.optim.AdamW(ref_model.parameters(), lr=1e-3))
    model = apply_fsdp(PlainStack(), mesh, param_dtype=None, reduce_dtype=None, cpu_offload=False,
                       reshard_after_forward=True)
    got = _stack_step(model, ids.chunk(world)[rank], torch.optim.AdamW(model.parameters(), lr=1e-3))
    plain = PlainStack(seed=3)
    load_into(plain, iter_full_params(model))
    with torch.no_grad():
        stream_equal = torch.equal(plain(ids), ref_model(ids))
    return {
        "grad_diff": _max_diff(ref["grads"], got["grads"]),
        "param_diff": _max_diff(ref["params"], got["params"]),
        "mesh": (tuple(mesh.shape), mesh.mesh_dim_names),
        "placements": all(isinstance(p, DTensor) and p.placements == (Replicate(), Shard(0))
                          for p in model.parameters()),
        "stream_max_diff": max((a - b).abs().max().item() for a, b in zip(plain.parameters(), ref_model.parameters())),
        "stream_equal": stream_equal,
    }


def test_hsdp_2x2_matches_single_process():
    results = run_distributed(_hsdp_worker, 4)
    for r in results:
        assert r["mesh"] == ((2, 2), ("replicate", "shard"))
        assert r["placements"]
        assert r["grad_diff"] < TOL and r["param_diff"] < TOL
        assert r["stream_max_diff"] < TOL
