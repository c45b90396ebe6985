"""Log-probs and entropies over chunks of response positions (hpcppo.models.forward_log_probs, issue 21).

The chunked path (the LM head, log-softmax, gather and entropy per chunk, checkpointed under autograd) must give the
numbers of the whole-logits path: values, and the gradients of the actor's loss as hpcppo.train.update computes it,
with and without the entropy bonus, the KL loss and a temperature; and it must not keep every chunk's logits alive.
"""

from __future__ import annotations

import functools

import pytest
import torch

from hpcppo import algos, models
from hpcppo.config.experiment import ActorSection
from hpcppo.models import compute_log_probs, forward_log_probs
from hpcppo.train import batching
from hpcppo.train.update import actor_loss

VOCAB, PROMPT, RESPONSE, BATCH = 96, 5, 11, 3
WHOLE = 1 << 40  # one chunk: the whole-logits computation
SMALL = BATCH * 3 * VOCAB  # 3 positions per chunk: 4 chunks, the last one short


def qwen2(*, tied: bool = False, seed: int = 0) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=tied)
    return Qwen2ForCausalLM(cfg).train()


def inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (BATCH, PROMPT + RESPONSE), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a left-padded row
    return ids, mask, models.position_ids_from_mask(mask)


def plain(model, ids, mask, pos, temperature=1.0):
    """log_softmax of the model's own logits: the definition, with no chunking anywhere."""
    with torch.no_grad():
        z = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -RESPONSE - 1:-1].float() / temperature
    lp = torch.log_softmax(z, -1).gather(-1, ids[:, -RESPONSE:, None]).squeeze(-1)
    p = torch.softmax(z, -1)
    return lp, -(p * torch.log_softmax(z, -1)).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("tied", [False, True])
def test_chunked_values_equal_the_whole_logits(temperature, tied):
    model, (ids, mask, pos) = qwen2(tied=tied), inputs()
    want_lp, want_ent = plain(model, ids, mask, pos, temperature)
    for chunk in (WHOLE, SMALL, 1):  # 1: one position of every row per chunk
        with torch.no_grad():
            lp, ent = forward_log_probs(model, ids, mask, pos, RESPONSE, temperature=temperature, with_entropy=True,
                                        chunk_elements=chunk)
        torch.testing.assert_close(lp, want_lp, rtol=0, atol=2e-6)
        torch.testing.assert_close(ent, want_ent, rtol=0, atol=2e-6)
    assert isinstance(model.lm_head, torch.nn.Linear)  # the stand-in is gone after the forward


def test_one_chunk_is_bit_identical_to_the_whole_logits_path():
    model, (ids, mask, pos) = qwen2(), inputs()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=RESPONSE + 1).logits
        z = logits[:, :-1].float().div_(0.7)
        want = z.gather(-1, ids[:, -RESPONSE:, None]).squeeze(-1) - torch.logsumexp(z, -1)
        got, _ = forward_log_probs(model, ids, mask, pos, RESPONSE, temperature=0.7)
    assert torch.equal(got, want)


def _grads(model, chunk: int, *, entropy_coeff: float, kl_loss: bool, temperature: float):
    ids, mask, pos = inputs()
    g = torch.Generator().manual_seed(7)
    mb = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, -RESPONSE:],
          "response_mask": (torch.rand(BATCH, RESPONSE, generator=g) > 0.2).float(),
          "old_log_probs": -4.5 + 0.3 * torch.randn(BATCH, RESPONSE, generator=g),
          "ref_log_probs": -4.5 + 0.3 * torch.randn(BATCH, RESPONSE, generator=g),
          "advantages": torch.randn(BATCH, RESPONSE, generator=g)}
    cfg = ActorSection(entropy_coeff=entropy_coeff, clip_ratio=0.2, clip_ratio_c=3.0, loss_agg_mode="token-mean",
                       kl_loss_type="low_var_kl", kl_loss_coef=0.1)  # the [actor] section, the rest its defaults
    old = models.forward.LOGITS_CHUNK_ELEMENTS
    models.forward.LOGITS_CHUNK_ELEMENTS = chunk  # as the trainer calls it: the module default
    try:
        loss_fn = actor_loss(model, cfg, clip_ratio_low=0.2, clip_ratio_high=0.28, kl_loss=kl_loss,
                             temperature=temperature)
        model.zero_grad(set_to_none=True)
        sums = batching.UpdateMetrics()
        loss = loss_fn(mb, algos.GlobalBatchInfo(), sums, 1)
        loss.backward()
    finally:
        models.forward.LOGITS_CHUNK_ELEMENTS = old
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("entropy_coeff,kl_loss,temperature,tied",
                         [(0.0, False, 1.0, False), (0.01, True, 0.7, False), (0.01, False, 1.0, True)])
def test_actor_loss_gradients_equal_the_whole_logits(entropy_coeff, kl_loss, temperature, tied):
    model = qwen2(tied=tied)
    kw = dict(entropy_coeff=entropy_coeff, kl_loss=kl_loss, temperature=temperature)
    want_loss, want = _grads(model, WHOLE, **kw)
    got_loss, got = _grads(model, SMALL, **kw)
    torch.testing.assert_close(got_loss, want_loss, rtol=0, atol=1e-6)
    assert want.keys() == got.keys() and any(g.abs().max() > 0 for g in want.values())
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7, msg=name)


def test_compute_log_probs_in_chunks_matches_and_leaves_no_graph():
    model, (ids, mask, pos) = qwen2(), inputs()
    want = compute_log_probs(model, ids, mask, pos, RESPONSE, micro_batch_size=2)
    old = models.forward.LOGITS_CHUNK_ELEMENTS
    models.forward.LOGITS_CHUNK_ELEMENTS = SMALL
    try:
        got, ent = compute_log_probs(model, ids, mask, pos, RESPONSE, micro_batch_size=2, with_entropy=True)
    finally:
        models.forward.LOGITS_CHUNK_ELEMENTS = old
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    assert not got.requires_grad and not ent.requires_grad


def test_a_model_that_transforms_its_logits_keeps_the_whole_logits_path():
    """Gemma 2 soft-caps the LM head's output inside its forward: standing in for the head would skip that."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    cfg = Gemma2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                       intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64, final_logit_softcapping=0.5)
    model = Gemma2ForCausalLM(cfg).eval()
    assert models.forward._chunkable_head(model) is None
    ids, mask, pos = inputs()
    with torch.no_grad():
        lp, _ = forward_log_probs(model, ids, mask, pos, RESPONSE, chunk_elements=SMALL)
    want, _ = plain(model, ids, mask, pos)
    torch.testing.assert_close(lp, want, rtol=0, atol=2e-6)


def test_a_forward_that_changes_the_heads_output_is_refused():
    model, (ids, mask, pos) = qwen2(), inputs()
    forward = model.forward

    @functools.wraps(forward)  # the same signature (logits_to_keep)
    def scaled(*args, **kwargs):  # what an unknown model class might do after its head
        out = forward(*args, **kwargs)
        out.logits = out.logits * 2
        return out

    model.forward = scaled
    ids, mask, pos = inputs()
    with pytest.raises(RuntimeError, match="changed its LM head's output"):
        forward_log_probs(model, ids, mask, pos, RESPONSE, with_entropy=True)
