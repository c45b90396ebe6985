"""``hpcppo plan`` on mixture-of-experts models (issue 37, item 5): every parameter counts for memory (FSDP shards and
gathers all experts, vLLM holds all of them), the ones a token runs for FLOPs; the shapes come from config.json
(Qwen3-MoE, Qwen2-MoE, Mixtral) or the known table (Qwen3 8B, 32B, 30B-A3B, 235B-A22B), checked against transformers'
own models and the Qwen model cards."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.compiler import compile_config
from hpcppo.sizing.catalog import GPUS, KNOWN_MODELS
from hpcppo.sizing.check import check_colocation
from hpcppo.sizing.estimate import estimate, model_shape

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "gsm8k-qwen3-30b-a3b.toml"
GB = 1e9

# Tiny configs of each layout the plan reads, with the pieces that change the count: a dense layer among expert
# layers (decoder_sparse_step, mlp_only_layers), q/k norms and head_dim != hidden / heads (Qwen3), a shared expert
# and q/k/v biases (Qwen2-MoE), experts of intermediate_size (Mixtral).
TINY = {
    "qwen3_moe": dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=24, num_experts=8, num_experts_per_tok=2,
                      vocab_size=128, decoder_sparse_step=2, mlp_only_layers=[3], tie_word_embeddings=False),
    "qwen2_moe": dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, vocab_size=128),
    "mixtral": dict(hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=128),
    "qwen3": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=24, vocab_size=128, tie_word_embeddings=True),
}


@pytest.mark.parametrize("kind", sorted(TINY))
def test_config_json_counts_match_transformers_models(kind, tmp_path):
    """Total parameters = transformers' model (built on the meta device from the same config.json); active = total
    less the experts a token does not run (E - k of E of every expert tensor)."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(kind, **TINY[kind])
    config.save_pretrained(tmp_path / kind)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." in name)
    e = TINY[kind].get("num_experts") or TINY[kind].get("num_local_experts") or 1
    k = TINY[kind].get("num_experts_per_tok", 1)
    shape, note = model_shape(str(tmp_path / kind))
    assert shape is not None and "config.json" in note, note
    assert shape.params == total
    assert shape.active_params == total - experts * (e - k) // e
    assert shape.is_moe == (kind != "qwen3")
    largest = max(p.numel() for p in model.parameters())
    assert shape.largest_tensor_elems == largest  # the host's rows in flight while loading


def test_qwen3_moe_layers_follow_decoder_sparse_step_and_mlp_only_layers(tmp_path):
    shape, _ = _shape(tmp_path, TINY["qwen3_moe"] | {"model_type": "qwen3_moe"})
    assert shape.moe_layers == 2  # layers 1 and 5: (i + 1) % 2 == 0, and 3 is in mlp_only_layers
    dense, _ = _shape(tmp_path, TINY["qwen3_moe"] | {"model_type": "qwen3_moe", "num_experts": 0})
    assert not dense.is_moe and dense.params == dense.active_params


def test_an_unknown_expert_layout_is_not_guessed(tmp_path):
    cfg = {"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 96, "vocab_size": 128, "n_routed_experts": 8, "num_experts_per_tok": 2}
    shape, why = _shape(tmp_path, cfg)
    assert shape is None
    assert "n_routed_experts" in why and "deepseek_v3" in why and "Qwen3-MoE" in why and "\n" not in why


def _shape(tmp_path, cfg):
    d = tmp_path / "m"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return model_shape(str(d))


def test_qwen3_counts_match_the_model_cards():
    # The Qwen model cards (https://huggingface.co/Qwen/<name>): total, non-embedding and (MoE) activated parameters.
    for name, total, non_embedding, active in (("qwen3-8b", 8.2, 6.95, None), ("qwen3-32b", 32.8, 31.2, None),
                                                ("qwen3-30b-a3b", 30.5, 29.9, 3.3),
                                                ("qwen3-235b-a22b", 235, 234, 22)):
        m = KNOWN_MODELS[name]
        assert m.params / GB == pytest.approx(total, rel=0.01), name
        assert (m.params - m.embedding_params) / GB == pytest.approx(non_embedding, rel=0.01), name
        assert m.active_params / GB == pytest.approx(active or total, rel=0.02), name
    # the -Instruct-2507 / -Thinking-2507 releases share the base model's shape
    assert model_shape("~/models/Qwen3-30B-A3B-Instruct-2507")[0] is KNOWN_MODELS["qwen3-30b-a3b"]


def test_memory_counts_every_expert_and_flops_the_active_ones():
    c = compile_config(EXAMPLE, "h100-cluster", check_paths=False, check_memory=False)
    budget = estimate(c.site, c.experiment, c.plan)
    m = KNOWN_MODELS["qwen3-30b-a3b"]
    shard, tp = budget.shard_size, c.plan.tensor_parallel_size
    assert shard == 32 and tp == 2
    update = {i.what: i.bytes for p in budget.phases if p.name == "actor update" for i in p.items}
    assert update["actor params (fp32 shard)"] == math.ceil(m.params * 4 / shard)
    assert update["actor AdamW moments (fp32 shard)"] == math.ceil(m.params * 8 / shard)
    # vLLM holds every expert, each split over TP (FusedMoEConfig: intermediate_size_per_partition)
    assert budget.kv["weights_bytes"] == math.ceil(m.params * 2 / tp)
    # KV: the attention's 4 KV heads of 128 over 48 layers, halved by TP=2
    assert budget.kv["kv_bytes_per_token_per_gpu"] == 2 * 48 * 2 * 128 * 2
    # GRPO with a KL loss: old log-probs and reference forwards (2N) and the update (8N, checkpointed), N active
    tokens = c.plan.samples_per_step * c.plan.max_sequence_length
    assert budget.time["update_flops"] == pytest.approx((2 + 2 + 8) * m.active_params * tokens)
    assert budget.time["update_flops"] < 0.2 * (2 + 2 + 8) * m.params * tokens


def test_decode_reads_the_experts_the_batch_is_routed_to():
    m = KNOWN_MODELS["qwen3-30b-a3b"]
    experts = 48 * 128 * 3 * 2048 * 768
    # one sequence: 8 of 128 experts per layer; a batch of 128: nearly all of them (1 - (15/16)^128)
    assert m.params_read(1) == pytest.approx(m.params - experts + experts * 8 / 128)
    assert m.params_read(128) == pytest.approx(m.params - experts * (1 - 8 / 128) ** 128)
    assert m.params_read(128) > 0.99 * m.params
    dense = KNOWN_MODELS["qwen3-32b"]
    assert dense.params_read(1) == dense.params_read(128) == dense.params


def test_the_qwen3_moe_example_compiles_fits_and_shows_total_and_active_parameters(capsys):
    c = compile_config(EXAMPLE, "h100-cluster", check_paths=False)
    budget = check_colocation(c.site, c.experiment, c.plan)
    assert budget is not None and not budget.problems and not budget.warnings
    assert budget.peak.total < GPUS["h100-80gb"].memory_bytes
    assert c.plan.world_size == 32 and not c.plan.hsdp
    assert main(["plan", str(EXAMPLE), "--site", "h100-cluster"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "30.53B parameters in total (memory), 3.35B active per token (FLOPs): 128 experts of 768, 8 per token, " \
           "in 48 of 48 layers" in out
    assert main(["plan", str(EXAMPLE), "--site", "h100-cluster", "--json"]) == 0
    model = json.loads(capsys.readouterr().out)["model"]
    assert model["params"] == KNOWN_MODELS["qwen3-30b-a3b"].params
    assert model["active_params"] == KNOWN_MODELS["qwen3-30b-a3b"].active_params
    assert model["num_experts"] == 128 and model["experts_per_token"] == 8 and model["moe_intermediate"] == 768


def test_lora_on_a_mixture_of_experts_says_what_it_does_not_count():
    m = KNOWN_MODELS["qwen3-30b-a3b"]
    c = compile_config(EXAMPLE, "h100-cluster", ["actor.lora.rank=16", "reference.offload=false"], check_paths=False, check_memory=False)
    budget = estimate(c.site, c.experiment, c.plan)
    # attention only (q, k, v, o) in the 48 expert layers: no dense gate/up/down of intermediate_size there
    h, q, kv = 2048, 32 * 128, 4 * 128
    assert f"rank 16, {48 * 16 * ((h + q) + 2 * (h + kv) + (q + h)) / 1e6:.1f}M adapter parameters trained (not " \
           "counted: adapters peft puts on the fused experts and the router)" in budget.model_note
    assert m.is_moe
