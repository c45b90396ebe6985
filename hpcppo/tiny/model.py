"""The tiny model itself: a seeded ~0.5M-parameter Llama, and how its answers are generated and scored.

Why Llama and not Qwen2: ``AutoTokenizer.from_pretrained`` on a directory whose config says
``model_type: qwen2`` forces ``Qwen2Tokenizer`` whatever ``tokenizer_config.json`` says (transformers
5.x lists qwen2 among models with a "wrong hub tokenizer class") and silently mangles a custom
vocabulary. With a Llama config the saved ``tokenizer_class`` is honoured, so the trainer can use
``AutoTokenizer`` as it will for real models. The architectures differ only in attention biases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcppo.data import synthetic
from hpcppo.tiny.settings import TinySettings
from hpcppo.tiny.tokenizer import encode_prompts

if TYPE_CHECKING:  # torch and transformers are imported lazily: the up-to-date check must stay instant
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast


def build_model(tokenizer: PreTrainedTokenizerFast, settings: TinySettings) -> LlamaForCausalLM:
    """A randomly initialised Llama model (seeded), or with ``settings.moe_experts`` a Qwen3-MoE one, its special ids
    and generation config set."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=settings.hidden_size,
        num_hidden_layers=settings.num_layers,
        num_attention_heads=settings.num_heads,
        num_key_value_heads=settings.num_kv_heads,
        max_position_embeddings=settings.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,  # a quarter fewer parameters; FSDP2 handles tied weights (torch-cpu.md)
    )
    if settings.moe_experts:
        # Every layer sparse (decoder_sparse_step 1, no mlp_only_layers), routed weights renormalised over the top-k
        # (norm_topk_prob, as Qwen3-30B-A3B's config.json); intermediate_size is the (unused) dense MLP's width.
        config: Any = Qwen3MoeConfig(**common,
                                     intermediate_size=settings.intermediate_size,
                                     moe_intermediate_size=settings.intermediate_size // settings.moe_top_k,
                                     num_experts=settings.moe_experts, num_experts_per_tok=settings.moe_top_k,
                                     norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
        build: Any = Qwen3MoeForCausalLM
    else:
        config, build = LlamaConfig(**common, intermediate_size=settings.intermediate_size), LlamaForCausalLM
    with torch.random.fork_rng():
        torch.manual_seed(settings.seed)
        model = build(config)
    # Plain sampling at temperature 1 by default: the accuracy recorded in hpcppo_tiny.json is measured so.
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=settings.max_new_tokens,
    )
    return model


def generate_answers(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    rows: list[dict[str, Any]],
    *,
    greedy: bool,
    seed: int,
    max_new_tokens: int,
    batch_size: int = 256,
) -> list[str]:
    """Decoded completions (special tokens skipped) for ``rows``; sampling at temperature 1 unless ``greedy``."""
    import torch

    out: list[str] = []
    model.eval()
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)  # evaluation must not consume the training RNG stream
        for start in range(0, len(rows), batch_size):
            enc = encode_prompts(tokenizer, rows[start : start + batch_size])
            # top_k=0 switches off transformers' default top-k of 50: plain sampling from the softmax.
            sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
            gen = model.generate(
                **enc,
                **sampling,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            out.extend(tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True))
    return out


def accuracy(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    rows: list[dict[str, Any]],
    *,
    greedy: bool,
    seed: int,
    max_new_tokens: int = 8,
) -> float:
    """Mean ``synthetic.compute_score`` of the model's completions on ``rows``."""
    texts = generate_answers(model, tokenizer, rows, greedy=greedy, seed=seed, max_new_tokens=max_new_tokens)
    scores = [
        synthetic.compute_score(r["data_source"], t, r["reward_model"]["ground_truth"]) for r, t in zip(rows, texts)
    ]
    return sum(scores) / len(scores)
