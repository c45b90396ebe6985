"""The packed (remove-padding) forward is exact per family (issue 37 item 6): for tiny Qwen3, Qwen3-MoE (built by
``make-model --moe``'s builder) and Gemma2 (sliding-window attention over a window shorter than the rows, attention
and final-logit soft-capping), each with the attention implementation compile picks for it
(:func:`hpcppo.config.attention.settle_attention`), the first step's loss and its gradient are the same with the rows
packed into one sequence (``model.remove_padding``) as with the padded batch. And what compile reads from the
transformers source as text agrees with the classes transformers builds.
"""

from __future__ import annotations

import json

import pytest
import torch

from hpcppo.config.attention import attention_support
from hpcppo.models import forward_log_probs, position_ids_from_mask
from hpcppo.models.forward import forward_log_probs_packed

VOCAB = 64
PROMPTS = (7, 3, 12, 5)  # prompt lengths (left-padded to the longest)
RESPONSES = (9, 4, 11, 2)  # response lengths (right-padded): rows up to 23 tokens, beyond Gemma2's window of 4
COMMON = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=64, max_position_embeddings=64, pad_token_id=0, tie_word_embeddings=True)


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=8))


def _qwen3_moe():
    from hpcppo.tiny import build_tokenizer
    from hpcppo.tiny.model import build_model
    from hpcppo.tiny.settings import TinySettings

    return build_model(build_tokenizer(), TinySettings(seed=5, hidden_size=32, intermediate_size=64, moe_experts=4,
                                                       moe_top_k=2))


def _gemma2():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(**COMMON, head_dim=8, sliding_window=4, attn_logit_softcapping=5.0,
                          final_logit_softcapping=3.0, layer_types=["sliding_attention", "full_attention"])
    return Gemma2ForCausalLM(config)


FAMILIES = {"qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "gemma2": _gemma2}


def _settled(model, tmp_path) -> str:
    """The implementation compile settles on for this family: the default (sdpa) when supported, else eager."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model.config.model_type,
                                                      "architectures": [type(model).__name__]}))
    support = attention_support(tmp_path)
    assert support is not None
    return "sdpa" if support.supports("sdpa") else "eager"


def _batch(generator: torch.Generator):
    width_p, width_r = max(PROMPTS), max(RESPONSES)
    ids = torch.zeros(len(PROMPTS), width_p + width_r, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
        ids[i, width_p - p: width_p + r] = torch.randint(1, VOCAB, (p + r,), generator=generator)
        mask[i, width_p - p: width_p + r] = 1
    return ids, mask, position_ids_from_mask(mask), mask[:, width_p:].float(), width_r


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_packed_and_padded_give_the_same_first_step_loss_and_gradient(family, tmp_path):
    torch.manual_seed(0)
    model = FAMILIES[family]()
    model.set_attn_implementation(_settled(model, tmp_path))
    with torch.no_grad():  # weights of order 1, so that a row seeing another row's tokens would show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    ids, mask, positions, response_mask, response_len = _batch(torch.Generator().manual_seed(1))
    results = []
    for forward in (forward_log_probs, forward_log_probs_packed):
        model.zero_grad()
        log_probs, _ = forward(model, ids, mask, positions, response_len)
        loss = -(log_probs * response_mask).sum() / response_mask.sum()  # the first step's policy-gradient form
        loss.backward()
        results.append((log_probs * response_mask, loss.detach(),
                        {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (padded, loss_a, grads_a), (packed, loss_b, grads_b) = results
    torch.testing.assert_close(packed, padded, rtol=0, atol=2e-5)
    torch.testing.assert_close(loss_b, loss_a, rtol=0, atol=2e-6)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_flags_read_as_text_are_the_classes_flags(family, tmp_path):
    model = FAMILIES[family]()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model.config.model_type,
                                                      "architectures": [type(model).__name__]}))
    support = attention_support(tmp_path)
    assert support is not None and support.architecture == type(model).__name__
    assert support.supports("sdpa") == type(model)._supports_sdpa
    assert support.supports("flash_attention_2") == type(model)._supports_flash_attn
    if not support.supports("sdpa"):  # what the job met (issue 37): transformers refuses it at load
        with pytest.raises(ValueError, match="does not support an attention implementation through "
                                             "torch.nn.functional.scaled_dot_product_attention"):
            model.set_attn_implementation("sdpa")
