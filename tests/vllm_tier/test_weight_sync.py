"""Weight sync into the real vLLM engine is exact: dummy weights, a sync, then greedy generations equal the HF
engine's token for token; a second sync after optimizer steps moves both engines alike.

From a plain model on 1 rank and from an FSDP2-sharded actor on 2 gloo ranks (the trainer's path:
``iter_full_params`` -> buckets -> vLLM's in-place layerwise reload). One spawn per world size.
"""

from __future__ import annotations

from pathlib import Path

import torch
from _engines import greedy, hf_engine, perturb_with_adam, prompts, rows, vllm_engine
from _spawn import run_distributed


def _sync_and_compare(model_dir: Path, data_dir: Path, source: torch.nn.Module, *, bucket_bytes: int) -> dict:
    from hpcppo.distributed.weights import iter_full_params

    ids = prompts(data_dir)
    engine = vllm_engine(model_dir, sync_bucket_bytes=bucket_bytes)
    hf = hf_engine(model_dir)
    out: dict = {"dummy_refused": False}
    try:
        engine.generate(ids, greedy())
    except RuntimeError:
        out["dummy_refused"] = True  # a dummy-loaded engine must not generate before its first sync
    for label in ("first", "second"):
        if label == "second":
            perturb_with_adam(source, ids)
        sent = engine.sync_weights(iter_full_params(source))
        hf.sync_weights(iter_full_params(source))
        out[label] = {"vllm": rows(engine.generate(ids, greedy())), "hf": rows(hf.generate(ids, greedy())),
                      "bytes": sent}
    engine.close()
    return out


def _one_rank(rank: int, world: int, model_dir: str, data_dir: str) -> dict:
    from transformers import AutoModelForCausalLM

    source = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return _sync_and_compare(Path(model_dir), Path(data_dir), source, bucket_bytes=2**20)


def _two_ranks(rank: int, world: int, model_dir: str, data_dir: str) -> dict:
    from transformers import AutoModelForCausalLM

    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.mesh import build_mesh

    mesh = build_mesh("cpu", world, 1, hsdp=False)
    actor = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    apply_fsdp(actor, mesh, param_dtype=None, reduce_dtype=None, cpu_offload=False, reshard_after_forward=True)
    # 64 KiB buckets: the stream is cut into many load_weights calls, across layer boundaries
    return _sync_and_compare(Path(model_dir), Path(data_dir), actor, bucket_bytes=64 * 2**10)


def _check(result: dict) -> None:
    assert result["dummy_refused"]
    first, second = result["first"], result["second"]
    assert first["vllm"] == first["hf"], "vLLM's greedy generations differ from the HF engine's after a sync"
    assert second["vllm"] == second["hf"], "vLLM's greedy generations differ after the second sync"
    # the optimizer steps changed what the model generates, so equality above is not the old weights agreeing
    assert second["hf"] != first["hf"]
    assert first["bytes"] == second["bytes"] > 0


def test_sync_from_a_plain_model_is_exact(warm_tiny):
    root, _ = warm_tiny
    [result] = run_distributed(_one_rank, 1, str(root / "model"), str(root / "data"))
    _check(result)


def test_sync_from_an_fsdp2_actor_on_two_ranks_is_exact(warm_tiny):
    root, _ = warm_tiny
    results = run_distributed(_two_ranks, 2, str(root / "model"), str(root / "data"))
    for result in results:
        _check(result)
    assert results[0]["second"]["vllm"] == results[1]["second"]["vllm"]  # both ranks hold the same actor
