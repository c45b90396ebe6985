"""Tiny random models of the families people train, built with the tiny arith tokenizer (issue 37's matrix).

Each family is a transformers config class and a few tiny sizes (hidden 128, head dim 32: vLLM's CPU attention
refuses 16; 2 layers, vocabulary 64); the weights are seeded and then perturbed (every floating tensor gets seeded
noise), so they differ from any initialisation: a norm weight that stayed at 1 or a bias at 0 could hide a sync
that forgets it. Used by tests/dist (loading, FSDP2
losses; the main .venv) and tests/vllm_tier (the family matrix; vLLM's venv), so it names nothing version-specific
beyond the config classes both transformers have.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# The tiny tokenizer's ids (hpcppo.tiny.tokenizer.SPECIAL_TOKENS): <pad> 0, <bos> 2, <eos> 3.
PAD, BOS, EOS = 0, 2, 3
COMMON: dict[str, Any] = dict(vocab_size=64, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=128, bos_token_id=BOS,
                              eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=False)


@dataclass(frozen=True)
class Family:
    """One family: its transformers config class and the sizes that differ from ``COMMON``."""

    name: str
    config_class: str
    extra: dict[str, Any] = field(default_factory=dict)
    moe: bool = False

    def config(self) -> Any:
        import transformers

        return getattr(transformers, self.config_class)(**{**COMMON, **self.extra})

    @property
    def attn(self) -> str:
        """The attention implementation compile gives this family by default (``config.attention``: sdpa where the
        installed transformers supports it, else eager; Gemma2 refuses sdpa in 5.25, not in 5.19), read the way
        compile reads it: from the saved config.json and transformers' source, no torch."""
        import tempfile

        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        from hpcppo.config.attention import attention_support, family_default

        config = self.config()
        config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
        with tempfile.TemporaryDirectory(prefix="family-attn-") as d:
            config.save_pretrained(d)
            support = attention_support(d)
        assert support is not None, f"{self.name}: compile cannot tell its attention support"
        return family_default(support)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", "LlamaConfig", {"intermediate_size": 128}),
    Family("qwen2", "Qwen2Config", {"intermediate_size": 128}),  # q/k/v biases
    Family("qwen3", "Qwen3Config", {"intermediate_size": 128, "head_dim": 32}),  # q/k norms
    Family("mistral", "MistralConfig", {"intermediate_size": 128, "head_dim": 32}),
    # sliding window on every other layer and both soft-caps: the window is shorter than a prompt + response
    Family("gemma2", "Gemma2Config", {"intermediate_size": 128, "head_dim": 32, "sliding_window": 16,
                                      "tie_word_embeddings": True}),
    Family("gemma3", "Gemma3TextConfig", {"intermediate_size": 128, "head_dim": 32, "sliding_window": 16,
                                          "tie_word_embeddings": True}),
    Family("phi3", "Phi3Config", {"intermediate_size": 128}),  # fused qkv_proj and gate_up_proj in transformers
    # a shared expert beside the routed ones, with its sigmoid gate (DeepSeek's layout without MLA)
    Family("qwen2_moe", "Qwen2MoeConfig", {"intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 4,
                                           "num_experts_per_tok": 2, "shared_expert_intermediate_size": 64,
                                           "norm_topk_prob": False, "decoder_sparse_step": 1}, moe=True),
    Family("qwen3_moe", "Qwen3MoeConfig", {"intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 4,
                                           "num_experts_per_tok": 2, "norm_topk_prob": True, "head_dim": 32,
                                           "decoder_sparse_step": 1}, moe=True),
)}


def perturb(model: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """Add seeded noise (``scale`` times each tensor's std, at least ``scale``) to every floating parameter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            spread = max(float(p.float().std()) if p.numel() > 1 else 0.0, 1.0)
            p.add_(torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype) * scale * spread)


def build(name: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """The family's causal LM, seeded and perturbed (float32)."""
    from transformers import AutoModelForCausalLM

    family = FAMILIES[name]
    config = family.config()
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=family.attn)
    perturb(model, seed + 1)
    return model.eval()


def save(name: str, directory: Path, seed: int = 0, **overrides: Any) -> Path:
    """The family's tiny model and the tiny tokenizer saved in ``directory`` (as ``save_pretrained`` writes them,
    per-expert names for a MoE); returns ``directory``."""
    from hpcppo.tiny.tokenizer import build_tokenizer

    model = build(name, seed, **overrides)
    model.generation_config.eos_token_id = EOS
    model.save_pretrained(directory)
    build_tokenizer().save_pretrained(directory)
    return directory


def prompts(count: int = 16, seed: int = 0) -> list[list[int]]:
    """``count`` chat-templated arithmetic prompts of the tiny task, tokenised."""
    from hpcppo.data import synthetic
    from hpcppo.tiny.tokenizer import build_tokenizer, prompt_text

    tok = build_tokenizer()
    rows = synthetic.generate_rows(count, seed=seed, split="val", max_operand=19, num_operands=2, operators=("+",))
    return [tok(prompt_text(tok, r), add_special_tokens=False)["input_ids"] for r in rows]
