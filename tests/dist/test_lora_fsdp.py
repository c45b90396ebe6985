"""LoRA on 2 real gloo ranks (issue 23): the actor built as the trainer builds it (meta device, peft's adapters
injected, FSDP2, each rank reading its rows) holds the same weights on every rank as an unsharded build, trains its
adapters only and like an unsharded model on the whole batch, and streams merged weights equal, bit for bit, to
peft's own ``merge_and_unload`` of an unsharded copy; the HF engine after that sync computes the merged model's
logits exactly."""

from __future__ import annotations

import functools

import pytest
import torch
from _spawn import run_distributed

LORA = dict(rank=4, alpha=8.0)


def _save(directory: str) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    cfg = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=97, vocab_size=67, max_position_embeddings=64, tie_word_embeddings=True)
    Qwen2ForCausalLM(cfg).save_pretrained(directory)


def _loss(model, ids: torch.Tensor) -> torch.Tensor:
    from hpcppo.models import forward_log_probs, position_ids_from_mask

    mask = torch.ones_like(ids)
    log_probs, _ = forward_log_probs(model, ids, mask, position_ids_from_mask(mask), 4)
    return -log_probs.mean()


def _train(rank: int, world_size: int, directory: str, steps: int, offload: bool) -> dict:
    from hpcppo import models
    from hpcppo.config.lora import LoraSection
    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.distributed.weights import iter_full_params
    from hpcppo.rollout.hf import HFRolloutEngine
    from hpcppo.train.build import load_sharded
    from hpcppo.train.lora import actor_weights, with_lora
    from hpcppo.train.optim import build_optimizer

    mesh = build_mesh("cpu", world_size, 1, hsdp=False)
    build = with_lora(functools.partial(models.build_actor, directory), LoraSection(**LORA))
    sharded = load_sharded(build, directory, torch.device("cpu"), lambda m: apply_fsdp(
        m, mesh, param_dtype=None, reduce_dtype=None, cpu_offload=offload, reshard_after_forward=True),
        offload=offload)
    whole = build()  # unsharded, the whole batch: what the shards must train like
    out: dict = {"start": {n: t.clone() for n, t in iter_full_params(sharded)},
                 "whole_start": {n: p.detach().clone() for n, p in whole.named_parameters()}}
    ids = torch.randint(0, 67, (4, 10), generator=torch.Generator().manual_seed(7))
    half = ids[rank * 2:(rank + 1) * 2]
    optims = [build_optimizer(m, lr=1e-2, weight_decay=0.01, betas=(0.9, 0.999)) for m in (sharded, whole)]
    out["trainable"] = [sum(p.numel() for g in o.param_groups for p in g["params"]) for o in optims]
    for _ in range(steps):
        for model, optim, batch in ((sharded, optims[0], half), (whole, optims[1], ids)):
            optim.zero_grad()
            _loss(model, batch).backward()  # FSDP2 averages the ranks' gradients: the whole batch's mean
            optim.step()
    out["end"] = {n: t.clone() for n, t in iter_full_params(sharded)}
    out["whole_end"] = {n: p.detach().clone() for n, p in whole.named_parameters()}
    engine = HFRolloutEngine.from_pretrained(directory, device="cpu")
    engine.sync_weights(actor_weights(sharded, dtype=engine.sync_dtype, into=engine.sync_targets))
    out["merged"] = {n: t.clone() for n, t in actor_weights(sharded, dtype=None, into=None)}
    with torch.no_grad():
        out["engine_logits"] = engine.model(input_ids=ids).logits
        out["actor_logits"] = sharded(input_ids=ids).logits
    return out


def _peft_merged(directory: str, trained: dict) -> tuple[dict, torch.nn.Module]:
    """peft's own merge: a PeftModel over an unsharded copy, given the trained weights, ``merge_and_unload``."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2ForCausalLM

    model = get_peft_model(Qwen2ForCausalLM.from_pretrained(directory), LoraConfig(
        r=LORA["rank"], lora_alpha=LORA["alpha"], target_modules="all-linear", bias="none"))
    missing = model.load_state_dict({"base_model.model." + n: t for n, t in trained.items()}, strict=False)
    assert not missing.unexpected_keys
    merged = model.merge_and_unload().eval()
    return {n: p.detach() for n, p in merged.named_parameters()}, merged


@pytest.mark.timeout(240)
@pytest.mark.parametrize("offload", [False, True], ids=["on-device", "param-offload"])
def test_sharded_lora_trains_like_unsharded_and_streams_peft_merged_weights(tmp_path, offload):
    _save(str(tmp_path))
    results = run_distributed(_train, 2, str(tmp_path), 2, offload)
    r0, r1 = results
    # Every rank builds the same adapters (lora_B = 0: step 0 is the base model), the same as an unsharded build.
    assert r0["start"].keys() == r0["whole_start"].keys()
    for name, tensor in r0["start"].items():
        assert torch.equal(tensor, r0["whole_start"][name]) and torch.equal(tensor, r1["start"][name]), name
        if ".lora_B." in name:
            assert not tensor.any(), name
    lora_names = [n for n in r0["start"] if ".lora_" in n]
    assert len(lora_names) == 2 * 7 * 2  # A and B of 7 linear layers in 2 decoder layers; lm_head left out
    # Only the adapters train (AdamW holds nothing else) and the base weights stay bit for bit.
    assert r0["trainable"][0] * 2 >= r0["trainable"][1] == sum(r0["start"][n].numel() for n in lora_names)
    for name, tensor in r0["end"].items():
        if ".lora_" in name:
            assert not torch.equal(tensor, r0["start"][name]), name
            torch.testing.assert_close(tensor, r0["whole_end"][name], rtol=1e-4, atol=1e-5)
        else:
            assert torch.equal(tensor, r0["start"][name]), name
    # Merged stream == peft's merge_and_unload, bit for bit, under the base model's names; the engine has it.
    expected, merged_model = _peft_merged(str(tmp_path), r0["end"])
    for result in results:
        assert result["merged"].keys() == expected.keys()
        for name, tensor in expected.items():
            assert torch.equal(result["merged"][name], tensor), name
        with torch.no_grad():
            assert torch.equal(result["engine_logits"], merged_model(input_ids=torch.randint(
                0, 67, (4, 10), generator=torch.Generator().manual_seed(7))).logits)
        torch.testing.assert_close(result["engine_logits"], result["actor_logits"], rtol=1e-4, atol=1e-5)
