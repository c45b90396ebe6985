"""``sum_v pi_v^2`` per response token from the old-log-prob pass (hpcppo.models.compute_log_prob_outputs), the
optimal token baselines' input (verl's ``actor.calculate_sum_pi_squared``, issue 33).

On every path of the pass (fixed micro-batches, token-budget micro-batches trimmed to their columns, rows packed
without padding, logits in one chunk or in several, a model whose log-probs come from its whole logits) the value
must be ``sum softmax(logits / T)^2`` of the model's own logits, and asking for it must not cost a tensor of the
logits' size (measured with torch's memory profiler, as tests/unit/test_plan_activations.py measures the planner).
"""

from __future__ import annotations

import pytest
import torch

from hpcppo import models
from hpcppo.models import compute_log_prob_outputs, compute_log_probs

from test_plan_activations import peak_bytes

VOCAB, PROMPT, RESPONSE, BATCH = 96, 5, 11, 4
SMALL = 3 * VOCAB  # 3 positions of one row (or 1 of 3 rows) per chunk: several chunks, the last one short


def qwen2(vocab: int = VOCAB, *, logit_scale: float | None = None) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=vocab, max_position_embeddings=64)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper distributions than a fresh init's near-uniform ones: sum pi^2 well above 1/V
        model.lm_head.weight.mul_(40.0)
    if logit_scale is not None:  # a config attribute of _LOGIT_TRANSFORMS: the whole-logits path
        model.config.logit_scale = logit_scale
    return model


def batch(vocab: int = VOCAB, rows: int = BATCH, seed: int = 1):
    """Left-padded prompts, right-padded responses of different lengths (one row with no response token)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, PROMPT + RESPONSE), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[1, -4:] = 0
    if rows > 3:
        mask[3, PROMPT:] = 0
        mask[2, :1] = 0
    return ids, mask, models.position_ids_from_mask(mask)


def direct(model, ids, mask, pos, temperature):
    """``sum_v softmax(z / T)_v^2`` of the model's own padded forward, in float64: the definition."""
    with torch.no_grad():
        z = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -RESPONSE - 1:-1].double()
    return (torch.softmax(z / temperature, -1) ** 2).sum(-1)


PATHS = {  # name: compute_log_prob_outputs' arguments and the logits chunk
    "padded": dict(micro_batch_size=2),
    "padded-chunked": dict(micro_batch_size=3, chunk=SMALL),
    "token-budget": dict(micro_batch_size=2, groups=[[0, 2], [1, 3]]),
    "token-budget-chunked": dict(micro_batch_size=2, groups=[[3, 1, 0], [2]], chunk=SMALL),
    "packed": dict(micro_batch_size=2, groups=[[0, 1], [2, 3]], packed=True),
    "packed-chunked": dict(micro_batch_size=2, groups=[[0, 1, 2], [3]], packed=True, chunk=SMALL),
    "packed-fixed": dict(micro_batch_size=4, packed=True),
}


def run(model, ids, mask, pos, temperature, *, micro_batch_size, groups=None, packed=False, chunk=None,
        with_sum_pi_squared=True, monkeypatch):
    if chunk is not None:
        monkeypatch.setattr(models.forward, "LOGITS_CHUNK_ELEMENTS", chunk)
    mbs = None if groups is None else [torch.tensor(g) for g in groups]
    return compute_log_prob_outputs(model, ids, mask, pos, RESPONSE, temperature=temperature,
                                    micro_batch_size=micro_batch_size, micro_batches=mbs, packed=packed,
                                    with_sum_pi_squared=with_sum_pi_squared)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("path", list(PATHS))
def test_each_path_gives_the_softmax_squares_of_the_models_logits(path, temperature, monkeypatch):
    model, (ids, mask, pos) = qwen2(), batch()
    out = run(model, ids, mask, pos, temperature, **PATHS[path], monkeypatch=monkeypatch)
    want = direct(model, ids, mask, pos, temperature)
    response = mask[:, -RESPONSE:].bool()
    assert out.sum_pi_squared is not None and out.sum_pi_squared.dtype == torch.float32
    assert not out.sum_pi_squared.requires_grad
    got = out.sum_pi_squared.double()
    torch.testing.assert_close(got[response], want[response], rtol=1e-5, atol=0)
    assert want[response].min() > 3.0 / VOCAB  # far from uniform: a wrong temperature or vocab would show
    if path != "padded":  # outside a trimmed or packed micro-batch's responses: 0, as its log-probs
        assert torch.equal(got[~response] == 0, out.log_probs[~response] == 0)
    # the log-probs of the same pass are those of the plain call, bit for bit: the sum comes after them
    plain = compute_log_probs(model, ids, mask, pos, RESPONSE, temperature=temperature,
                              micro_batch_size=PATHS[path]["micro_batch_size"],
                              micro_batches=None if "groups" not in PATHS[path]
                              else [torch.tensor(g) for g in PATHS[path]["groups"]],
                              packed=PATHS[path].get("packed", False))
    assert torch.equal(out.log_probs, plain)


@pytest.mark.parametrize("packed", [False, True])
def test_a_model_whose_forward_transforms_its_logits_takes_them_whole(packed, monkeypatch):
    model, (ids, mask, pos) = qwen2(logit_scale=0.5), batch()
    assert models.forward._chunkable_head(model) is None
    want = direct(model, ids, mask, pos, 0.8)
    out = run(model, ids, mask, pos, 0.8, micro_batch_size=2, groups=[[0, 1], [2, 3]], packed=packed,
              monkeypatch=monkeypatch)
    response = mask[:, -RESPONSE:].bool()
    assert out.sum_pi_squared is not None
    torch.testing.assert_close(out.sum_pi_squared.double()[response], want[response], rtol=1e-5, atol=0)


def test_only_when_asked_and_never_with_autograd(monkeypatch):
    model, (ids, mask, pos) = qwen2(), batch()
    out = run(model, ids, mask, pos, 1.0, micro_batch_size=2, with_sum_pi_squared=False, monkeypatch=monkeypatch)
    assert out.sum_pi_squared is None and out.entropy is None
    with pytest.raises(ValueError, match="sum_pi_squared is computed without autograd"):
        models.forward._outputs_padded(model, ids, mask, pos, RESPONSE, temperature=1.0, with_entropy=False,
                                       entropy_grad=False, with_sum_pi_squared=True, chunk_elements=None)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("chunk_positions", [None, 4])  # None: the whole logits in one chunk
def test_asking_for_it_costs_no_tensor_of_the_logits_size(chunk_positions, packed, monkeypatch):
    """Peak live bytes of the old-log-prob pass with and without the sum: a few ``[B, R]`` floats apart at most,
    never a logits chunk's ``B x positions x V`` floats (verl's ``logsumexp(2 z)`` would add two)."""
    vocab, rows = 32000, 2
    model, (ids, mask, pos) = qwen2(vocab), batch(vocab, rows=rows)
    chunk = None if chunk_positions is None else rows * chunk_positions * vocab
    positions = RESPONSE if chunk_positions is None else chunk_positions
    kw = dict(micro_batch_size=rows, packed=packed, chunk=chunk, monkeypatch=monkeypatch)
    without = peak_bytes(lambda: run(model, ids, mask, pos, 0.7, with_sum_pi_squared=False, **kw))
    with_it = peak_bytes(lambda: run(model, ids, mask, pos, 0.7, with_sum_pi_squared=True, **kw))
    chunk_bytes = rows * positions * vocab * 4
    print(f"peak bytes: without {without}, with {with_it}, one float32 logits chunk {chunk_bytes}")
    assert with_it - without <= 64 * rows * RESPONSE, (without, with_it, chunk_bytes)


@pytest.mark.parametrize("packed", [False, True])
def test_with_the_entropy_both_come_from_the_same_chunks(packed, monkeypatch):
    """The sum overwrites the chunk's logits: the entropy, read from them too, is taken before."""
    model, (ids, mask, pos) = qwen2(), batch()
    monkeypatch.setattr(models.forward, "LOGITS_CHUNK_ELEMENTS", SMALL)
    groups = [torch.tensor([0, 1]), torch.tensor([2, 3])]
    both = compute_log_prob_outputs(model, ids, mask, pos, RESPONSE, temperature=0.6, micro_batch_size=2,
                                    micro_batches=groups, packed=packed, with_entropy=True, with_sum_pi_squared=True)
    alone = compute_log_prob_outputs(model, ids, mask, pos, RESPONSE, temperature=0.6, micro_batch_size=2,
                                     micro_batches=groups, packed=packed, with_entropy=True)
    assert both.entropy is not None and alone.entropy is not None and both.sum_pi_squared is not None
    assert torch.equal(both.entropy, alone.entropy) and torch.equal(both.log_probs, alone.log_probs)
    response = mask[:, -RESPONSE:].bool()
    want = direct(model, ids, mask, pos, 0.6)
    torch.testing.assert_close(both.sum_pi_squared.double()[response], want[response], rtol=1e-5, atol=0)
