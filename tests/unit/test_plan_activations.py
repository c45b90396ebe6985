"""The planner's activation and logits bytes against what torch really keeps alive, measured on CPU.

torch's memory profiler (``torch.profiler._memory_profiler``, torch 2.13) replays every allocation and free of a
profiled region; the peak of live bytes minus the model's own weights (and gradients) is what the planner estimates.
The autograd graph and its saved tensors are the same on CUDA; what CPU cannot show is the caching allocator's
fragmentation, which the planner covers with its fixed reserve. A real Qwen2 model from transformers runs through
hpcppo.models.forward_log_probs, as the trainer runs it, in bf16 (the compute dtype of GPU runs).
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from hpcppo import models
from hpcppo.algos import losses
from hpcppo.models import forward_log_probs
from hpcppo.sizing.catalog import ModelShape
from hpcppo.sizing.estimate import LOGITS_CHUNK_ELEMENTS, _layer_acts, _logits, logit_chunk_positions


def peak_bytes(fn) -> int:
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(torch.device("cpu"))
    return max(sum(s) for s in sizes)


def qwen2(hidden: int, layers: int, intermediate: int, vocab: int) -> tuple[torch.nn.Module, ModelShape]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=intermediate, vocab_size=vocab, max_position_embeddings=512,
                      attn_implementation="sdpa")
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).train()
    shape = ModelShape("measured", hidden, layers, 4, 2, intermediate, vocab, False, attention_bias=True)
    assert shape.params == sum(p.numel() for p in model.parameters())
    return model, shape


@pytest.mark.parametrize("checkpointing", [False, True])
def test_layer_activations(checkpointing):
    model, shape = qwen2(hidden=256, layers=4, intermediate=1024, vocab=64)  # a tiny vocabulary: no logits to speak of
    if checkpointing:  # as build.py does for model.gradient_checkpointing
        from hpcppo.distributed.fsdp import apply_activation_checkpointing

        apply_activation_checkpointing(model)
    ids = torch.randint(0, 64, (4, 128))

    def step():
        model(input_ids=ids, use_cache=False).logits.float().sum().backward()

    measured = peak_bytes(step) - 2 * 2 * shape.params  # bf16 weights and their gradients
    planned = _layer_acts(shape, ids.numel(), 2, checkpointing=checkpointing)
    assert planned == pytest.approx(measured, rel=0.1), (measured, planned)


@pytest.mark.parametrize("chunk_positions", [None, 12, 6])  # None: the whole logits in one chunk
@pytest.mark.parametrize("update,bonus", [(False, False), (True, True), (True, False)])
def test_log_prob_logits(update, bonus, chunk_positions, monkeypatch):
    vocab, batch, prompt, response = 32000, 4, 16, 48
    model, shape = qwen2(hidden=64, layers=2, intermediate=128, vocab=vocab)  # a large vocabulary: logits dominate
    ids = torch.randint(0, vocab, (batch, prompt + response))
    mask, pos = torch.ones_like(ids), torch.arange(prompt + response).expand(batch, -1)
    # Blocks far smaller than the logits, as the default block is against a real micro-batch's logits.
    monkeypatch.setattr(losses, "ENTROPY_MIN_ROWS", 16)
    monkeypatch.setattr(losses, "ENTROPY_CHUNK_ELEMENTS", 1)
    chunk = models.LOGITS_CHUNK_ELEMENTS if chunk_positions is None else batch * chunk_positions * vocab
    assert logit_chunk_positions(batch, response, vocab, chunk) == (chunk_positions or response)

    def step():
        if update:  # as hpcppo.train.update's actor loss: log-probs and entropy, with autograd when it is a bonus
            log_probs, entropy = forward_log_probs(model, ids, mask, pos, response, with_entropy=True,
                                                   entropy_grad=bonus, chunk_elements=chunk)
            (log_probs.sum() + (entropy.sum() if bonus else 0)).backward()
        else:  # old log-probs and the reference's: no autograd
            with torch.no_grad():
                forward_log_probs(model, ids, mask, pos, response, chunk_elements=chunk)

    measured = peak_bytes(step) - 2 * shape.params * (2 if update else 1)
    planned = _logits(shape, batch, response, 2, update=update, entropy_bonus=bonus, chunk_elements=chunk)
    if update and chunk_positions:  # the planner's bound for a checkpointed chunk's backward
        assert measured <= planned <= 1.35 * measured, (measured, planned)
    else:
        assert planned == pytest.approx(measured, rel=0.1), (measured, planned, measured / (batch * (response + 1) * vocab))
    if chunk_positions:  # what chunking is for: a fraction of the whole logits' bytes
        whole = _logits(shape, batch, response, 2, update=update, entropy_bonus=bonus, chunk_elements=1 << 40)
        assert measured < whole * (chunk_positions + 1) / response, (measured, whole)


def test_the_planner_chunks_as_the_models_do():
    assert LOGITS_CHUNK_ELEMENTS == models.LOGITS_CHUNK_ELEMENTS
    for micro, response, vocab in [(4, 4096, 151_936), (1, 100, 64), (64, 2048, 32_000), (3, 7, 10**9)]:
        want = min(response, models.forward._chunk_positions(micro, response, vocab, LOGITS_CHUNK_ELEMENTS))
        assert logit_chunk_positions(micro, response, vocab) == want
