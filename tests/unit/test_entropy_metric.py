"""The entropy as a metric only (``actor.entropy_coeff = 0``): computed detached and in blocks, the same numbers as the
entropy with autograd, and the actor's loss and gradients unchanged while no [B, R, V] softmax stays in the graph."""

from __future__ import annotations

import attrs
import pytest
import torch

from hpcppo import algos
from hpcppo.algos import losses
from hpcppo.config.experiment import ActorSection
from hpcppo.models import forward_log_probs
from hpcppo.train import batching
from hpcppo.train.update import actor_loss


@pytest.mark.parametrize("shape", [(4, 48, 3000), (8, 100, 5000), (2, 700, 3000), (3, 257, 2000), (1, 5, 200000),
                                   (900, 4000)])
def test_entropy_metric_is_bit_identical_to_entropy_from_logits(shape):
    g = torch.Generator().manual_seed(sum(shape))
    logits = torch.randn(*shape, generator=g) * 4
    want = losses.entropy_from_logits(logits)
    for chunk in (None, 1, 300 * shape[-1]):  # one block, blocks of the minimum rows, blocks of 300 rows
        got = losses.entropy_metric(logits, chunk_elements=chunk)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert torch.equal(got, want), (shape, chunk, (got - want).abs().max())


def test_entropy_metric_takes_low_precision_and_strided_logits_like_entropy_from_logits():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(6, 301, 1000, generator=g) * 3
    strided = base[:, :-1, :]  # as forward_log_probs slices the model's logits: not contiguous across the batch
    assert not strided.is_contiguous()
    assert torch.equal(losses.entropy_metric(strided, chunk_elements=1), losses.entropy_from_logits(strided))
    bf = base.to(torch.bfloat16)
    got = losses.entropy_metric(bf, chunk_elements=1)
    assert got.dtype == torch.float32 and torch.equal(got, losses.entropy_from_logits(bf))


def test_entropy_metric_has_no_graph():
    logits = torch.randn(2, 3, 7, requires_grad=True)
    assert not losses.entropy_metric(logits).requires_grad
    with pytest.raises(ValueError, match=r"\[B, T, vocab\] or \[N, vocab\], got shape \(7,\)"):
        losses.entropy_metric(torch.randn(7))


@pytest.mark.parametrize("batch,length,rows", [(1, 1, 256), (3, 10, 256), (8, 100, 256), (30, 100, 256),
                                               (2, 700, 256), (5, 256, 256), (4, 511, 256), (7, 33, 64)])
def test_entropy_blocks_tile_the_grid_in_order_without_short_blocks(batch, length, rows):
    blocks = losses._entropy_blocks(batch, length, rows)
    cells = [(b, t) for bs, ts in blocks for b in range(batch)[bs] for t in range(length)[ts]]
    assert cells == [(b, t) for b in range(batch) for t in range(length)]  # every cell once, batch-major
    smallest = min((bs.stop - bs.start) * (ts.stop - ts.start) for bs, ts in blocks)
    assert smallest >= min(batch * length, rows)
    if batch * length >= 2 * rows:
        assert len(blocks) > 1


# -- the actor loss ---------------------------------------------------------------------------------------------

VOCAB, BATCH, PROMPT, RESPONSE = 3000, 4, 6, 70


def _model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).float().train()


def _micro_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (BATCH, PROMPT + RESPONSE), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a left-padded prompt
    response_mask = torch.ones(BATCH, RESPONSE, dtype=torch.long)
    response_mask[1, 50:] = 0  # a response that ended early
    return {
        "input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, PROMPT:], "response_mask": response_mask,
        "old_log_probs": -torch.rand(BATCH, RESPONSE, generator=g) * 8,
        "ref_log_probs": -torch.rand(BATCH, RESPONSE, generator=g) * 8,
        "advantages": torch.randn(BATCH, RESPONSE, generator=g),
    }


def _reference_loss(actor, cfg, *, kl_loss: bool, temperature: float):
    """The actor loss as it was before the metric-only entropy: the entropy always taken with autograd."""

    def loss(mb, info, sums, n_micro):
        log_probs, entropy = forward_log_probs(actor, mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                                               mb["responses"].shape[1], temperature=temperature, with_entropy=True,
                                               entropy_grad=True)
        out = algos.policy_loss(mb["old_log_probs"], log_probs, mb["advantages"], mb["response_mask"], cfg.clip_ratio,
                                cfg.clip_ratio, cfg.clip_ratio, cfg.clip_ratio_c, cfg.loss_agg_mode, batch_info=info)
        total = out["loss"]
        ent = algos.agg_loss(entropy, mb["response_mask"], cfg.loss_agg_mode, batch_info=info)
        if cfg.entropy_coeff:
            total = total - cfg.entropy_coeff * ent
        if kl_loss:
            kl = algos.kl_penalty(log_probs, mb["ref_log_probs"], cfg.kl_loss_type)
            kl_value = algos.agg_loss(kl, mb["response_mask"], cfg.loss_agg_mode, batch_info=info)
            total = total + cfg.kl_loss_coef * kl_value
            sums.add("actor/kl_loss", kl_value, n_micro)
        sums.add("actor/pg_loss", out["loss"], n_micro)
        sums.add("actor/entropy", ent, n_micro)
        for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
            sums.add(f"actor/{key}", out[key])
        return total

    return loss


def _run(make_loss, cfg, *, kl_loss: bool, temperature: float):
    model = _model()
    mb = _micro_batch()
    info = batching.global_batch_info(mb["response_mask"], 1, RESPONSE)
    sums = batching.UpdateMetrics()
    loss = make_loss(model, cfg, kl_loss=kl_loss, temperature=temperature)(mb, info, sums, 2)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return loss.detach(), grads, sums.reduce()


def _hpcppo_loss(actor, cfg, *, kl_loss, temperature):
    return actor_loss(actor, cfg, clip_ratio_low=cfg.clip_ratio, clip_ratio_high=cfg.clip_ratio, kl_loss=kl_loss,
                      temperature=temperature)


@pytest.mark.parametrize("entropy_coeff,kl_loss,temperature,agg", [
    (0.0, False, 1.0, "token-mean"), (0.0, True, 0.7, "seq-mean-token-sum-norm"),
    (0.01, False, 1.0, "token-mean"), (0.01, True, 0.7, "seq-mean-token-mean")])
def test_actor_loss_gradients_and_metrics_are_bit_identical_to_the_entropy_with_graph(entropy_coeff, kl_loss,
                                                                                       temperature, agg, monkeypatch):
    # Blocks of at least 128 rows: the 4 x 70 response tokens are taken as two blocks of two sequences, so the
    # metric path really runs block by block.
    monkeypatch.setattr(losses, "ENTROPY_MIN_ROWS", 128)
    monkeypatch.setattr(losses, "ENTROPY_CHUNK_ELEMENTS", 1)
    cfg = attrs.evolve(ActorSection(), entropy_coeff=entropy_coeff, loss_agg_mode=agg, kl_loss_coef=0.1)
    want_loss, want_grads, want_metrics = _run(_reference_loss, cfg, kl_loss=kl_loss, temperature=temperature)
    got_loss, got_grads, got_metrics = _run(_hpcppo_loss, cfg, kl_loss=kl_loss, temperature=temperature)
    assert torch.equal(got_loss, want_loss)
    assert sorted(got_grads) == sorted(want_grads)
    for name, grad in want_grads.items():
        assert torch.equal(got_grads[name], grad), name
    assert got_metrics == want_metrics  # exact floats, actor/entropy included
    assert want_metrics["actor/entropy"] > 0


def _saved_logits_sized(make_loss, cfg) -> int:
    """How many [B, R, V]-sized tensors the loss's autograd graph keeps for backward."""
    model = _model()
    mb = _micro_batch()
    info = batching.global_batch_info(mb["response_mask"], 1, RESPONSE)
    sizes: list[int] = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        make_loss(model, cfg, kl_loss=False, temperature=1.0)(mb, info, batching.UpdateMetrics(), 1)
    return sum(1 for n in sizes if n >= BATCH * RESPONSE * VOCAB)


def test_without_an_entropy_bonus_the_graph_keeps_no_entropy_buffers():
    zero = attrs.evolve(ActorSection(), entropy_coeff=0.0)
    bonus = attrs.evolve(ActorSection(), entropy_coeff=0.01)
    with_graph = _saved_logits_sized(_reference_loss, zero)  # before: the softmax (and logits) saved for the entropy
    metric_only = _saved_logits_sized(_hpcppo_loss, zero)
    assert metric_only < with_graph, (metric_only, with_graph)
    # With a bonus the entropy is differentiated, as before.
    assert _saved_logits_sized(_hpcppo_loss, bonus) == _saved_logits_sized(_reference_loss, bonus) == with_graph
