"""GPU scenarios, one per process: ``python tests/gpu/_gpu_scenarios.py NAME OUT_DIR [MODEL_DIR]``.

Started by ``_gpu_launch.run_scenario`` once per rank with torchrun-style variables. A scenario only *measures*:
it saves ``OUT_DIR/result-<rank>.pt`` (tensors and plain numbers/strings, loadable with ``weights_only=True``) and
the tests assert on it, so a failed assertion names the figure that was off. Any exception exits non-zero and the
test shows the rank's log.

``HPCPPO_GPU_SCENARIO_DEVICE=cpu`` runs the nccl and fsdp scenarios on gloo/CPU: only for checking this file on a
machine without a GPU; the tests never set it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

TIMEOUT_S = 120  # every collective: a rank that misses one fails the scenario instead of hanging it
DEVICE = os.environ.get("HPCPPO_GPU_SCENARIO_DEVICE", "cuda")


def _save(out_dir: Path, rank: int, result: dict[str, Any]) -> None:
    tmp = out_dir / f".result-{rank}.pt.tmp"
    torch.save(result, tmp)
    os.replace(tmp, out_dir / f"result-{rank}.pt")


def _init() -> Any:
    from hpcppo.distributed.env import detect_env, init_distributed

    env = detect_env(os.environ, device_type=DEVICE)
    init_distributed(env, timeout_s=TIMEOUT_S)
    return env


def _device(env: Any) -> torch.device:
    return torch.device("cuda", env.local_rank) if env.device_type == "cuda" else torch.device("cpu")


# ----------------------------------------------------------------------------------------------------- nccl
def scenario_nccl(out_dir: Path) -> dict[str, Any]:
    """Process group from the environment, all-reduce correctness on the GPU, and ``run_preflight``."""
    import json

    from hpcppo.train.preflight import run_preflight

    env = _init()
    device = _device(env)
    rank, world = dist.get_rank(), dist.get_world_size()
    result: dict[str, Any] = {"backend": dist.get_backend(), "rank": rank, "world": world, "env_rank": env.rank,
                              "env_backend": env.backend, "device": str(device)}
    if device.type == "cuda":
        result["current_device"] = torch.cuda.current_device()
    # 4 MiB of float32, big enough for NCCL's ring/tree algorithms rather than a single small-message path.
    t = torch.full((1 << 20,), float(rank + 1), device=device)
    dist.all_reduce(t)
    result["sum_expected"] = world * (world + 1) / 2
    result["sum_min"], result["sum_max"] = float(t.min()), float(t.max())
    x = torch.randn(1 << 16, generator=torch.Generator().manual_seed(100 + rank)).to(device)
    gathered = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(gathered, x)
    reference = torch.stack(gathered).sum(0)
    dist.all_reduce(x)
    result["random_max_err"] = float((x - reference).abs().max())
    run_dir = out_dir / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    result["preflight_code"] = run_preflight(env, run_dir, world, [])
    if rank == 0:
        result["preflight"] = json.loads((run_dir / "preflight.json").read_text())
    return result


# ----------------------------------------------------------------------------------------------------- fsdp
def _lm_loss(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
    """Next-token cross-entropy (float32) and the dtype of the logits the model returned."""
    logits = model(input_ids=ids, use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())
    return loss, logits.dtype


def _fsdp_variant(env: Any, mesh: Any, ids: torch.Tensor, *, offload: bool) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor

    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.weights import iter_full_params
    from hpcppo.train.optim import build_optimizer
    from hpcppo.tiny import TinySettings, build_model, build_tokenizer

    device = _device(env)
    tokenizer = build_tokenizer()
    # build_model is seeded: every rank (and the unsharded reference) starts from the same weights.
    reference = build_model(tokenizer, TinySettings()).to(device)
    initial = {n: p.detach().clone() for n, p in reference.named_parameters()}
    with torch.no_grad():
        ref_loss, _ = _lm_loss(reference, ids)

    model = build_model(tokenizer, TinySettings()).to(device)
    apply_fsdp(model, mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cpu_offload=offload,
               reshard_after_forward=True)
    params = list(model.named_parameters())
    r: dict[str, Any] = {
        "all_dtensor": all(isinstance(p, DTensor) for _, p in params),
        "local_devices": sorted({p.to_local().device.type for _, p in params}),
        "master_dtypes": sorted({str(p.dtype) for _, p in params}),
        "all_pinned": all(p.to_local().is_pinned() for _, p in params),
    }
    # Streaming before any update must give back exactly the weights the model was built with.
    streamed = {n: t.detach().to("cpu", copy=True) for n, t in iter_full_params(model)}
    r["stream_names_match"] = sorted(streamed) == sorted(initial)
    r["stream_max_err_initial"] = max(float((streamed[n] - initial[n].cpu()).abs().max()) for n in initial
                                      if n in streamed)

    seen: list[torch.dtype] = []
    first_linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    hook = first_linear.register_forward_pre_hook(lambda mod, args: seen.append(mod.weight.dtype))
    optim = build_optimizer(model, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.999))
    loss, logits_dtype = _lm_loss(model, ids)
    loss.backward()
    hook.remove()
    grads = [p.grad for _, p in params]
    r["loss"], r["ref_loss"] = float(loss.detach()), float(ref_loss)
    r["compute_dtypes"] = sorted({str(d) for d in seen})
    r["logits_dtype"] = str(logits_dtype)
    r["grads_present"] = all(g is not None for g in grads)
    r["grad_dtypes"] = sorted({str(g.dtype) for g in grads if g is not None})
    # The local shards only: a full_tensor() of CPU-offloaded gradients would ask NCCL to gather host memory.
    r["grads_finite"] = all(bool(torch.isfinite(g.to_local()).all()) for g in grads if g is not None)
    optim.step()
    optim.zero_grad(set_to_none=True)
    with torch.no_grad():
        loss_after, _ = _lm_loss(model, ids)
    r["loss_after"] = float(loss_after)

    # After the step: iter_full_params against torch's own full state dict (an independent gather path).
    after = {n: t.detach().to("cpu", copy=True) for n, t in iter_full_params(model)}
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if env.rank == 0:  # with cpu_offload the full state dict lands on rank 0 only
        common = [n for n in after if n in full]
        r["state_dict_names_covered"] = len(common) == len(after)
        r["stream_max_err_after"] = max(float((after[n] - full[n].float()).abs().max()) for n in common)
    r["max_update"] = max(float((after[n] - initial[n].cpu()).abs().max()) for n in initial if n in after)
    del model, optim, reference
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return r


def scenario_fsdp(out_dir: Path) -> dict[str, Any]:
    """FSDP2 with bf16 compute and fp32 reduction, without and with CPU offload, on the tiny Llama."""
    from hpcppo.distributed.mesh import build_mesh

    env = _init()
    world = dist.get_world_size()
    mesh = build_mesh(env.device_type, world, 1, hsdp=False)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(8, 60, (4 * world, 24), generator=g)[env.rank * 4:(env.rank + 1) * 4].to(_device(env))
    return {"world": world, "device_type": env.device_type,
            "plain": _fsdp_variant(env, mesh, ids, offload=False),
            "offload": _fsdp_variant(env, mesh, ids, offload=True)}


# ----------------------------------------------------------------------------------------------------- vllm
def _log_probs(model: torch.nn.Module, batch: Any, temperature: float) -> torch.Tensor:
    """``compute_log_probs`` of ``model`` on the batch's sequences, ``[B, R]`` on CPU, 0 off the response mask."""
    from hpcppo.models import compute_log_probs

    device = next(model.parameters()).device
    lp = compute_log_probs(model, batch.input_ids.to(device), batch.attention_mask.to(device),
                           batch.position_ids.to(device), batch.response_width, temperature=temperature,
                           micro_batch_size=64)
    return lp.cpu() * batch.response_mask


def _fields(batch: Any) -> dict[str, torch.Tensor]:
    import dataclasses

    return {f.name: getattr(batch, f.name).cpu() for f in dataclasses.fields(batch)}


def scenario_vllm(out_dir: Path, model_dir: str) -> dict[str, Any]:
    """The colocated vLLM engine against the HF model it serves: layout, log-probs, weight sync, sleep, close.

    ``model_dir`` is the warm-started tiny model (peaked, EOS-terminated distributions: log-prob comparisons
    that a wrong position or temperature would visibly break).
    """
    import dataclasses

    from hpcppo.data import synthetic
    from hpcppo.distributed.weights import iter_full_params
    from hpcppo.rollout.base import SamplingParams
    from hpcppo.rollout.vllm_engine import VLLMRolloutEngine
    from hpcppo.models import load_causal_lm
    from hpcppo.tiny import build_tokenizer, encode_prompts

    env = _init()  # external_launcher joins the process group the trainer made (env:// from our variables)
    device = _device(env)
    tokenizer = build_tokenizer()
    rows = synthetic.generate_rows(4, seed=5, split="val", max_operand=19)
    prompts = encode_prompts(tokenizer, rows)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    r: dict[str, Any] = {"eos": eos, "pad": pad, "prompt_ids": prompts["input_ids"],
                         "prompt_mask": prompts["attention_mask"]}

    # load_format="dummy" (the default): random weights until the first sync, as in training.
    engine = VLLMRolloutEngine(model_dir, gpu_memory_utilization=0.2, dtype="bfloat16", enforce_eager=True, seed=0,
                               max_model_len=64, dist_env=env)
    hf = load_causal_lm(model_dir, dtype="float32").to(device).eval()
    perturbed = load_causal_lm(model_dir, dtype="float32").to(device).eval()
    with torch.no_grad():
        perturbed.get_input_embeddings().weight.mul_(0.5)  # tied: the LM head changes with it

    sample = SamplingParams(eos_token_id=eos, pad_token_id=pad, n=2, temperature=1.0, max_new_tokens=8, seed=1234)
    try:
        engine.generate(prompts, sample)
        r["dummy_generate_error"] = ""
    except RuntimeError as exc:
        r["dummy_generate_error"] = str(exc)
    r["first_sync_bytes"] = engine.sync_weights(iter_full_params(hf, dtype=engine.sync_dtype))
    b1 = engine.generate(prompts, sample)
    r["b1"], r["b1_hf"] = _fields(b1), _log_probs(hf, b1, 1.0)
    r["b1_again"] = _fields(engine.generate(prompts, sample))
    # Extra stop ids = each row's first sampled token: with the same seed every row must stop after one token.
    stops = tuple(sorted({eos, *b1.response_ids[:, 0].tolist()}))
    r["stops"] = torch.tensor(stops)
    r["b2"] = _fields(engine.generate(prompts, dataclasses.replace(sample, eos_token_id=stops)))
    b_t07 = engine.generate(prompts, dataclasses.replace(sample, temperature=0.7))
    r["t07"], r["t07_hf"], r["t07_hf_t1"] = _fields(b_t07), _log_probs(hf, b_t07, 0.7), _log_probs(hf, b_t07, 1.0)
    greedy = dataclasses.replace(sample, n=1, temperature=0.0)
    g1 = engine.generate(prompts, greedy)
    r["g1"], r["g1_hf"] = _fields(g1), _log_probs(hf, g1, 1.0)

    r["param_bytes"] = sum(p.numel() * p.element_size() for p in perturbed.parameters())
    r["sync_bytes_perturbed"] = engine.sync_weights(iter_full_params(perturbed))
    b3 = engine.generate(prompts, sample)
    r["b3"], r["b3_hf_perturbed"] = _fields(b3), _log_probs(perturbed, b3, 1.0)
    r["b3_hf_original"] = _log_probs(hf, b3, 1.0)
    r["sync_bytes_original"] = engine.sync_weights(iter_full_params(hf))
    b4 = engine.generate(prompts, sample)
    r["b4"], r["b4_hf"] = _fields(b4), _log_probs(hf, b4, 1.0)

    torch.cuda.synchronize()
    r["free_awake"] = torch.cuda.mem_get_info()[0]
    r["total_memory"] = torch.cuda.mem_get_info()[1]
    engine.sleep()  # level 2: weights discarded with the KV cache
    torch.cuda.synchronize()
    r["free_asleep"] = torch.cuda.mem_get_info()[0]
    try:
        engine.generate(prompts, greedy)
        r["asleep_generate_error"] = ""
    except RuntimeError as exc:
        r["asleep_generate_error"] = str(exc)
    # The trainer's step: wake_up (weights) -> sync in bf16 (prefix cache reset, KV cache mapped) -> generate
    engine.wake_up()
    engine.sync_weights(iter_full_params(hf, dtype=engine.sync_dtype))
    r["g2"] = _fields(engine.generate(prompts, greedy))
    # Level 1 keeps the weights in host memory: no sync needed after waking.
    engine.sleep(level=1)
    engine.wake_up()
    r["g3"] = _fields(engine.generate(prompts, greedy))

    # The low-peak path: weights back first, sync while the KV cache is still released, then the cache.
    engine.sleep()
    engine.wake_up(tags=["weights"])
    engine.sync_weights(iter_full_params(perturbed))
    engine.wake_up(tags=["kv_cache"])
    b5 = engine.generate(prompts, sample)
    r["b5"], r["b5_hf_perturbed"] = _fields(b5), _log_probs(perturbed, b5, 1.0)

    engine.close()
    try:
        engine.llm  # noqa: B018 - the property raises once closed
        r["closed_error"] = ""
    except RuntimeError as exc:
        r["closed_error"] = str(exc)
    return r


def scenario_vllm_tp2(out_dir: Path, model_dir: str) -> dict[str, Any]:
    """Two ranks, one vLLM engine with tensor_parallel_size=2 (external launcher): the trainer's step twice.

    ``RANK``/``LOCAL_RANK`` are removed after the process group exists, as under srun (which sets only SLURM_*):
    the engine must export them again from the detected environment before vLLM reads them. Both ranks submit the
    same prompts and seed (one TP group) and must receive the same samples.
    """
    from hpcppo.distributed.env import all_gather_object
    from hpcppo.distributed.weights import iter_full_params
    from hpcppo.data import synthetic
    from hpcppo.models import load_causal_lm
    from hpcppo.rollout.base import SamplingParams
    from hpcppo.rollout.vllm_engine import VLLMRolloutEngine
    from hpcppo.tiny import build_tokenizer, encode_prompts

    env = _init()
    device = _device(env)
    for key in ("RANK", "LOCAL_RANK"):
        os.environ.pop(key, None)
    tokenizer = build_tokenizer()
    prompts = encode_prompts(tokenizer, synthetic.generate_rows(4, seed=5, split="val", max_operand=19))
    hf = load_causal_lm(model_dir, dtype="float32").to(device).eval()
    engine = VLLMRolloutEngine(model_dir, tensor_parallel_size=2, gpu_memory_utilization=0.2, dtype="bfloat16",
                               enforce_eager=True, seed=0, max_model_len=64, dist_env=env)
    r: dict[str, Any] = {"rank_env": os.environ.get("RANK", "")}
    sample = SamplingParams(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, n=2,
                            temperature=1.0, max_new_tokens=8, seed=77)
    for step in range(2):
        engine.wake_up()
        engine.sync_weights(iter_full_params(hf, dtype=engine.sync_dtype))
        batch = engine.generate(prompts, sample)
        engine.sleep()
        r[f"b{step}"], r[f"b{step}_hf"] = _fields(batch), _log_probs(hf, batch, 1.0)
    responses = all_gather_object(r["b0"]["response_ids"].tolist())
    r["same_across_ranks"] = torch.tensor(int(all(x == responses[0] for x in responses)))
    engine.close()
    return r


SCENARIOS = {"nccl": scenario_nccl, "fsdp": scenario_fsdp, "vllm": scenario_vllm, "vllm_tp2": scenario_vllm_tp2}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in SCENARIOS:
        print(f"usage: _gpu_scenarios.py {{{','.join(SCENARIOS)}}} OUT_DIR [ARGS]", file=sys.stderr)
        return 2
    from hpcppo.distributed.env import destroy_distributed

    out_dir = Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = SCENARIOS[argv[0]](out_dir, *argv[2:])
        rank = dist.get_rank() if dist.is_initialized() else 0
        _save(out_dir, rank, result)
    finally:
        destroy_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
