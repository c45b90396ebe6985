"""The actor's loss (hpcppo.train.update.actor_loss) with the rollout correction: a micro-batch's
``rollout_is_weights`` reach the policy loss, bypass mode swaps the loss for verl's ``bypass_mode`` and logs its
``rollout_corr/*``, and sapo gets the section's temperatures."""

from __future__ import annotations

import dataclasses

import attrs
import pytest
import torch

from hpcppo import algos
from hpcppo.config.experiment import ActorSection
from hpcppo.models import forward_log_probs
from hpcppo.train import batching
from hpcppo.train.update import actor_loss

VOCAB, BATCH, PROMPT, RESPONSE = 200, 3, 4, 6


def _model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=32, vocab_size=VOCAB, max_position_embeddings=32)
    return LlamaForCausalLM(cfg).float().train()


def _mb() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (BATCH, PROMPT + RESPONSE), generator=g)
    mask = torch.ones_like(ids)
    response_mask = torch.ones(BATCH, RESPONSE, dtype=torch.long)
    response_mask[1, 4:] = 0
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, PROMPT:], "response_mask": response_mask,
            "old_log_probs": -torch.rand(BATCH, RESPONSE, generator=g) * 6,
            "advantages": torch.randn(BATCH, RESPONSE, generator=g)}


def _run(cfg, mb, **kw):
    sums = batching.UpdateMetrics()
    info = batching.global_batch_info(mb["response_mask"], 1, RESPONSE)
    loss = actor_loss(_model(), cfg, clip_ratio_low=0.2, clip_ratio_high=0.2, kl_loss=False, temperature=1.0,
                      **kw)(mb, info, sums, 1)
    return loss.item(), sums.reduce()


def test_the_micro_batchs_weights_reach_the_policy_loss():
    cfg = ActorSection()
    mb = _mb()
    plain, _ = _run(cfg, mb)
    halved, _ = _run(cfg, mb | {"rollout_is_weights": torch.full((BATCH, RESPONSE), 0.5)})
    assert halved == pytest.approx(0.5 * plain, rel=1e-6) and abs(plain) > 1e-3


def test_sapo_gets_the_sections_temperatures():
    cfg = attrs.evolve(ActorSection(), policy_loss=attrs.evolve(ActorSection().policy_loss, loss_mode="sapo",
                                                                tau_pos=2.0, tau_neg=3.0))
    mb = _mb()
    got, _ = _run(cfg, mb)
    log_probs, _ = forward_log_probs(_model(), mb["input_ids"], mb["attention_mask"], mb["position_ids"], RESPONSE,
                                     temperature=1.0, with_entropy=True)
    info = batching.global_batch_info(mb["response_mask"], 1, RESPONSE)
    want = algos.compute_policy_loss("sapo", mb["old_log_probs"], log_probs, mb["advantages"], mb["response_mask"],
                                     params=algos.PolicyLossParams(tau_pos=2.0, tau_neg=3.0), batch_info=info)
    assert got == pytest.approx(want["loss"].item(), rel=1e-6)
    default = algos.compute_policy_loss("sapo", mb["old_log_probs"], log_probs, mb["advantages"], mb["response_mask"],
                                        batch_info=info)
    assert got != pytest.approx(default["loss"].item(), rel=1e-6)


def test_bypass_mode_runs_verls_bypass_loss_and_logs_its_correction():
    rc = algos.RolloutCorrectionParams(rollout_is="token", bypass_mode=True, loss_type="reinforce")
    mb = _mb()
    calls = []

    def reduce(t):
        calls.append(t)
        return t

    got, metrics = _run(ActorSection(), mb, rollout_correction=rc, all_reduce_sum=reduce)
    assert "rollout_corr/rollout_is_mean" in metrics and "rollout_corr/kl" in metrics
    assert "actor/pg_clipfrac" not in metrics and "actor/ppo_kl" in metrics  # reinforce reports ppo_kl only
    assert not calls  # no batch normalisation asked
    rc = dataclasses.replace(rc, rollout_is_batch_normalize=True)
    _, metrics = _run(ActorSection(), mb, rollout_correction=rc, all_reduce_sum=reduce)
    assert len(calls) == 2 and "rollout_corr/rollout_is_batch_norm_factor" in metrics  # sums over ranks
