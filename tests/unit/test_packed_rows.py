"""Padding removal on CPU (issue 21, item 2): which of transformers' attention implementations computes rows packed
into one sequence (position ids restarting per row, no attention mask) as it computes them one by one.

At transformers 5.24 ``masking_utils.create_causal_mask`` looks for restarting position ids when no 2-D attention mask
and no KV cache are given (``_preprocess_mask_arguments`` -> ``find_packed_sequence_indices``) and ands a
block-diagonal mask into the causal one, for ``sdpa`` and ``eager`` alike; with a mask of ones (or a cache:
``use_cache`` must be False) it does not, and the rows attend to each other. This test is the evidence
docs/performance.md cites; the trainer's forwards keep trimmed micro-batches (the reasons are there).
"""

from __future__ import annotations

import pytest
import torch

VOCAB = 64
LENGTHS = (5, 9, 3, 12)


def _model(attn: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64, attn_implementation=attn)
    return Qwen2ForCausalLM(config).eval()


def _token_log_probs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits[:-1].float(), -1).gather(-1, ids[1:, None]).squeeze(-1)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_rows_give_the_log_probs_of_rows_run_one_by_one(attn):
    model = _model(attn)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(1, VOCAB, (n,), generator=g) for n in LENGTHS]
    with torch.no_grad():
        alone = [_token_log_probs(model(input_ids=r[None], use_cache=False).logits[0], r) for r in rows]
        packed_ids = torch.cat(rows)[None]
        positions = torch.cat([torch.arange(n) for n in LENGTHS])[None]
        logits = model(input_ids=packed_ids, position_ids=positions, use_cache=False).logits[0]
        # the same, with a 2-D mask of ones: no packed-sequence detection, every row sees the rows before it
        mixed = model(input_ids=packed_ids, position_ids=positions,
                      attention_mask=torch.ones_like(packed_ids), use_cache=False).logits[0]
    starts = torch.tensor((0,) + LENGTHS).cumsum(0)
    for i, row in enumerate(rows):
        span = slice(int(starts[i]), int(starts[i + 1]))
        torch.testing.assert_close(_token_log_probs(logits[span], row), alone[i], rtol=0, atol=1e-5)
        if i:  # a row after the first one changes when it may attend to the rows before it
            assert (_token_log_probs(mixed[span], row) - alone[i]).abs().max() > 1e-3
