"""The family matrix (issue 37): for each family people train, a tiny random model (tests/dist/_families.py:
hidden 128, 2 layers, the tiny arith tokenizer, weights perturbed away from any initialisation) through the
project's real ``VLLMRolloutEngine`` on vLLM's CPU backend:

* vLLM loading the weights from disk generates, greedy, what the HF engine generates (the family runs alike in both);
* a dummy-loaded engine after ``sync_weights`` generates the same rows;
* after an optimizer step on the source, a second sync changes vLLM's rows as the HF engine's change;
* for Qwen3-MoE, LoRA's merged sync (``hpcppo.train.lora.actor_weights``) into the same engine agrees too, and a
  stream that leaves out one expert's slice is refused (the per-layer count, ``vllm_reload.IncompleteSync``), after
  which the engine refuses to generate until a sync succeeds.

LoRA's merged stream is family-independent code (``hpcppo.models.lora.merge_stream`` merges ``W + s B A`` by name,
and peft only adapts ``nn.Linear``): test_lora_sync.py runs it on the tiny Llama; here it runs on the one family
whose stream the engine reshapes (fused experts split per expert), beside linear layers that carry adapters.

One spawned rank runs every family, one after another (vLLM is imported once); each family's outcome, or its
error, comes back to the parametrised tests. The FSDP2 losses per family are tests/dist/test_family_fsdp.py.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

import pytest
from _engines import greedy, perturb_with_adam, rows, vllm_engine
from _families import FAMILIES, prompts, save
from _spawn import run_distributed

LORA_FAMILY = "qwen3_moe"


def _agree(a: list[list[int]], b: list[list[int]]) -> int:
    return sum(x == y for x, y in zip(a, b, strict=True))


def _drop_one_expert(stream):
    """The stream without expert 1's down projection of the first MoE layer: a partial expert load."""
    for name, tensor in stream:
        if name.endswith("layers.0.mlp.experts.down_proj"):
            tensor = tensor[[0, 2, 3]]  # three experts of four: split, it names experts 0, 1, 2 (3 never arrives)
        yield name, tensor


def _lora(model_dir: Path, engine, hf, ids) -> dict:
    import functools

    from hpcppo import models
    from hpcppo.config.lora import LoraSection
    from hpcppo.train.lora import actor_weights, with_lora

    # The attention projections: peft's all-linear would also wrap the fused experts, which apply_lora refuses
    # (only nn.Linear merges as W + s B A).
    lora = LoraSection(rank=8, alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    actor = with_lora(functools.partial(models.build_actor, str(model_dir)), lora)()
    perturb_with_adam(actor, ids, lr=3e-2, steps=3)  # only the adapters have gradients
    engine.sync_weights(actor_weights(actor, dtype=engine.sync_dtype, into=None))
    hf.sync_weights(actor_weights(actor, dtype=hf.sync_dtype, into=hf.sync_targets))
    return {"vllm": rows(engine.generate(ids, greedy())), "hf": rows(hf.generate(ids, greedy()))}


def _one_family(name: str, root: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from hpcppo.distributed.weights import iter_full_params
    from hpcppo.rollout.hf import HFRolloutEngine

    family = FAMILIES[name]
    model_dir = save(name, root / name)
    ids = prompts()
    hf = HFRolloutEngine.from_pretrained(model_dir, dtype="float32", device="cpu", attn_implementation=family.attn)
    out: dict = {"hf": rows(hf.generate(ids, greedy()))}
    disk = vllm_engine(model_dir, load_format="auto")
    out["disk"] = rows(disk.generate(ids, greedy()))
    disk.close()
    del disk
    source = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=family.attn)
    engine = vllm_engine(model_dir, sync_bucket_bytes=64 * 2**10)  # many load_weights calls, across layers
    engine.sync_weights(iter_full_params(source))
    out["synced"] = rows(engine.generate(ids, greedy()))
    perturb_with_adam(source, ids)
    engine.sync_weights(iter_full_params(source))
    hf.sync_weights(iter_full_params(source))
    out["second"] = {"vllm": rows(engine.generate(ids, greedy())), "hf": rows(hf.generate(ids, greedy()))}
    if name == LORA_FAMILY:
        out["lora"] = _lora(model_dir, engine, hf, ids)
    if family.moe:
        try:
            engine.sync_weights(_drop_one_expert(iter_full_params(source)))
            out["partial"] = "accepted"
        except KeyError as e:
            out["partial"] = str(e)
        try:
            engine.generate(ids, greedy())
            out["generate_after_failed_sync"] = "generated"
        except RuntimeError as e:
            out["generate_after_failed_sync"] = str(e)
    engine.close()
    return out


def _matrix(rank: int, world: int, root: str) -> dict:
    results = {}
    for name in FAMILIES:
        t0 = time.perf_counter()
        try:
            results[name] = _one_family(name, Path(root))
        except Exception:  # one family's failure must not hide the others' results
            results[name] = {"error": traceback.format_exc(limit=-8)}
        results[name]["seconds"] = round(time.perf_counter() - t0, 1)
    return results


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    [result] = run_distributed(_matrix, 1, str(tmp_path_factory.mktemp("families")))
    for name, r in result.items():
        print(f"{name}: {r.get('seconds')} s", "error" if "error" in r else
              f"disk {_agree(r['disk'], r['hf'])}/16, sync {_agree(r['synced'], r['hf'])}/16")
    return result


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_sync_agrees_with_the_hf_engine_and_with_vllm_from_disk(matrix, name):
    r = matrix[name]
    assert "error" not in r, r.get("error")
    n = len(r["hf"])
    assert r["disk"] == r["hf"], f"{name}: vLLM from disk agrees with HF on {_agree(r['disk'], r['hf'])}/{n}"
    assert r["synced"] == r["hf"], f"{name}: vLLM after sync agrees with HF on {_agree(r['synced'], r['hf'])}/{n}"
    second = r["second"]
    assert second["vllm"] == second["hf"], (f"{name}: after the second sync vLLM agrees with HF on "
                                            f"{_agree(second['vllm'], second['hf'])}/{n}")
    assert second["hf"] != r["hf"], f"{name}: the optimizer step did not change the generations"


def test_lora_merged_sync_of_a_moe_model(matrix):
    r = matrix[LORA_FAMILY]
    assert "error" not in r, r.get("error")
    assert r["lora"]["vllm"] == r["lora"]["hf"]
    assert r["lora"]["hf"] != r["second"]["hf"]  # the adapters changed what the model generates


@pytest.mark.parametrize("name", [n for n, f in FAMILIES.items() if f.moe])
def test_a_partial_expert_load_is_refused(matrix, name):
    r = matrix[name]
    assert "error" not in r, r.get("error")
    assert "layers.0.mlp.experts" in r["partial"] and "part of their weights" in r["partial"], r["partial"]
    assert "a failed sync" in r["generate_after_failed_sync"]  # the engine refuses to sample from the mix
