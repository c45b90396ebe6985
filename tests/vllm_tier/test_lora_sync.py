"""LoRA's merged weight sync into the real vLLM engine (issue 23): a LoRA actor built as the trainer builds it, its
adapters trained a few steps, streamed merged (``hpcppo.train.lora.actor_weights``: ``W + (alpha / r) B A`` under the
base model's names) into vLLM's CPU backend and into the HF engine: both then generate the same tokens, greedy, and
not what the base model generates. vLLM runs the merged plain weights: no LoRA support of its own is asked for."""

from __future__ import annotations

import functools
from pathlib import Path

from _engines import greedy, hf_engine, perturb_with_adam, prompts, rows, vllm_engine
from _spawn import run_distributed


def _lora_sync(rank: int, world: int, model_dir: str, data_dir: str) -> dict:
    from hpcppo import models
    from hpcppo.config.lora import LoraSection
    from hpcppo.train.lora import actor_weights, with_lora

    ids = prompts(Path(data_dir))
    actor = with_lora(functools.partial(models.build_actor, model_dir), LoraSection(rank=8, alpha=16))()
    hf = hf_engine(Path(model_dir))
    out = {"base": rows(hf.generate(ids, greedy()))}
    perturb_with_adam(actor, ids, lr=3e-2, steps=3)  # only the adapters have gradients
    engine = vllm_engine(Path(model_dir))
    out["bytes"] = engine.sync_weights(actor_weights(actor, dtype=engine.sync_dtype, into=None))
    hf.sync_weights(actor_weights(actor, dtype=hf.sync_dtype, into=hf.sync_targets))
    out["vllm"], out["hf"] = rows(engine.generate(ids, greedy())), rows(hf.generate(ids, greedy()))
    engine.close()
    return out


def test_merged_lora_weights_in_vllm_generate_what_the_hf_engine_generates(warm_tiny):
    root, _ = warm_tiny
    [result] = run_distributed(_lora_sync, 1, str(root / "model"), str(root / "data"))
    assert result["bytes"] > 0
    assert result["vllm"] == result["hf"], "vLLM's greedy generations differ from the HF engine's after a LoRA sync"
    assert result["hf"] != result["base"]  # the adapters changed what the model generates
