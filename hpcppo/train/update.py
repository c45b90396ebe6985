"""The PPO update: one skeleton (epochs -> mini-batches -> micro-batches -> gradient sync -> clipped step) shared by
the actor and the critic, each of which contributes only its loss.

A loss function gets one micro-batch, the global mini-batch's counts (:class:`~hpcppo.algos.GlobalBatchInfo`, so the
gradient does not depend on how the mini-batch is split over ranks and micro-batches), the metric sums and the number
of micro-batches in this mini-batch; it records its metrics and returns the loss to differentiate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hpcppo import algos
from hpcppo.models import forward_log_probs, forward_log_probs_packed, forward_values, forward_values_packed
from hpcppo.train import batching
from hpcppo.train.optim import LRSchedule, OptimizerStateOffload

LossFn = Callable[[Mapping[str, Any], algos.GlobalBatchInfo, batching.UpdateMetrics, int], torch.Tensor]


@dataclass(frozen=True)
class UpdateSettings:
    """How one model is updated on one step: its shapes per rank and its clip."""

    prefix: str  # "actor" or "critic": the metric namespace
    epochs: int
    mini_batch_per_rank: int
    micro_batch_per_rank: int
    grad_clip: float
    world_size: int
    max_response_length: int  # the loss-scale factor of the seq-mean-token-sum-norm aggregation
    # > 0: micro-batches of at most this many tokens, padding included, each trimmed to its own longest prompt and
    # response (batching.token_budget_groups), instead of micro_batch_per_rank rows padded to the batch's widths
    max_tokens_per_micro_batch: int = 0
    # the loss runs its micro-batches' rows packed without padding (model.remove_padding): the budget counts real
    # tokens then
    remove_padding: bool = False


def run_update(batch: Mapping[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer, lr: LRSchedule,
               settings: UpdateSettings, loss_fn: LossFn, *, offload_optimizer: bool = False,
               on_step: Callable[[], None] | None = None) -> dict[str, float]:
    """Run ``settings.epochs`` passes of mini-batch updates of ``model`` over this rank's ``batch``; return the metrics
    (means over micro-batches and ranks), ``<prefix>/grad_norm`` and ``<prefix>/lr`` included.

    Collective: every micro-batch's gradient is reduce-scattered into the sharded gradients (under HSDP the
    all-reduce across replicas runs on the last micro-batch of each mini-batch only: ``batching.set_last_micro_batch``),
    so no rank ever holds more than its gradient shards plus the layer in backward; the metrics are averaged over
    ranks at the end. ``on_step`` runs after each optimizer step.
    """
    sums = batching.UpdateMetrics()
    offload = OptimizerStateOffload(optimizer, enabled=offload_optimizer)
    minis = list(batching.split(batch, settings.mini_batch_per_rank))
    groups = None
    if settings.max_tokens_per_micro_batch:  # the same rows in every epoch: one agreement for the whole update
        groups = batching.token_budget_groups([m["attention_mask"] for m in minis], batch["responses"].shape[1],
                                              settings.max_tokens_per_micro_batch, packed=settings.remove_padding)
    for _ in range(settings.epochs):
        for k, mini in enumerate(minis):
            # The losses divide by the global mini-batch's tokens and sequences (and seq-mean-token-sum-norm by the
            # fixed max_response_length), never by a micro-batch's own: the gradient is the same however the
            # mini-batch is split (tests/unit/test_token_budget.py, every loss_agg_mode).
            info = batching.global_batch_info(mini["response_mask"], settings.world_size, settings.max_response_length)
            micros = (list(batching.split(mini, settings.micro_batch_per_rank)) if groups is None
                      else [batching.take_rows(mini, rows) for rows in groups[k]])
            for i, mb in enumerate(micros):
                batching.set_last_micro_batch(model, i == len(micros) - 1)
                loss_fn(mb, info, sums, len(micros)).backward()
            offload.before_step()
            sums.add(f"{settings.prefix}/grad_norm", batching.clip_and_step(model, optimizer, settings.grad_clip))
            lr.step()
            if on_step is not None:
                on_step()
    offload.after_update()
    return sums.reduce() | {f"{settings.prefix}/lr": lr.lr}


def critic_loss(critic: nn.Module, cfg: Any, *, packed: bool = False) -> LossFn:
    """verl's clipped value loss; ``cfg`` is the ``[critic]`` section; ``packed``: the forward without padding."""
    forward = forward_values_packed if packed else forward_values

    def loss(mb: Mapping[str, Any], info: algos.GlobalBatchInfo, sums: batching.UpdateMetrics, n_micro: int):
        values = forward(critic, mb["input_ids"], mb["attention_mask"], mb["position_ids"], mb["responses"].shape[1])
        out = algos.value_loss(values, mb["values"], mb["returns"], mb["response_mask"], cfg.cliprange_value,
                               cfg.loss_agg_mode, batch_info=info)
        # A batch_info loss is this micro-batch's share of the global mini-batch loss x dp: the mean over ranks of
        # the sum over micro-batches is the mini-batch loss.
        sums.add("critic/vf_loss", out["loss"], n_micro)
        sums.add("critic/vf_clipfrac", out["vf_clipfrac"])
        return out["loss"]

    return loss


def actor_loss(actor: nn.Module, cfg: Any, *, clip_ratio_low: float, clip_ratio_high: float, kl_loss: bool,
               temperature: float, generator: torch.Generator | None = None, packed: bool = False,
               rollout_correction: algos.RolloutCorrectionParams | None = None,
               all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None) -> LossFn:
    """The policy loss of ``cfg.policy_loss.loss_mode`` (verl's; :mod:`hpcppo.algos.policy_losses`), minus the entropy
    bonus, plus the KL loss when it is on; ``cfg`` is the ``[actor]`` section, the clip bounds and ``kl_loss`` from
    the run plan, ``generator`` the random choice of ``clip_cov``. A mode logs only the metrics verl's reports.
    A micro-batch's ``rollout_is_weights`` (decoupled rollout correction) reach the loss; with
    ``rollout_correction.bypass_mode`` the loss is ``bypass_mode`` (verl's ``apply_bypass_mode``), whose batch
    normalisation sums over ranks with ``all_reduce_sum``, and its ``rollout_corr/*`` metrics are logged."""

    # Without a bonus the entropy is only a metric: computed detached and in blocks, it keeps no [B, R, V] softmax
    # in the graph until backward (the same logged values; algos.entropy_metric).
    bonus = bool(cfg.entropy_coeff)
    forward = forward_log_probs_packed if packed else forward_log_probs
    pl = cfg.policy_loss
    params = algos.PolicyLossParams(clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high,
                              clip_ratio_c=cfg.clip_ratio_c, clip_cov_ratio=pl.clip_cov_ratio, clip_cov_lb=pl.clip_cov_lb,
                              clip_cov_ub=pl.clip_cov_ub, kl_cov_ratio=pl.kl_cov_ratio, ppo_kl_coef=pl.ppo_kl_coef,
                              tau_pos=pl.tau_pos, tau_neg=pl.tau_neg, generator=generator,
                              rollout_correction=rollout_correction, all_reduce_sum=all_reduce_sum)
    mode = "bypass_mode" if rollout_correction is not None and rollout_correction.bypass_mode else pl.loss_mode

    def loss(mb: Mapping[str, Any], info: algos.GlobalBatchInfo, sums: batching.UpdateMetrics, n_micro: int):
        log_probs, entropy = forward(actor, mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                                     mb["responses"].shape[1], temperature=temperature, with_entropy=True,
                                     entropy_grad=bonus)
        out = algos.compute_policy_loss(mode, mb["old_log_probs"], log_probs, mb["advantages"],
                                        mb["response_mask"], loss_agg_mode=cfg.loss_agg_mode, params=params,
                                        batch_info=info, rollout_is_weights=mb.get("rollout_is_weights"))
        total = out["loss"]
        assert entropy is not None  # with_entropy=True
        ent = algos.agg_loss(entropy, mb["response_mask"], cfg.loss_agg_mode, batch_info=info)
        if bonus:
            total = total - cfg.entropy_coeff * ent
        if kl_loss:
            kl = algos.kl_penalty(log_probs, mb["ref_log_probs"], cfg.kl_loss_type)
            kl_value = algos.agg_loss(kl, mb["response_mask"], cfg.loss_agg_mode, batch_info=info)
            total = total + cfg.kl_loss_coef * kl_value
            sums.add("actor/kl_loss", kl_value, n_micro)
        sums.add("actor/pg_loss", out["loss"], n_micro)
        sums.add("actor/entropy", ent, n_micro)
        for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
            if key in out:
                sums.add(f"actor/{key}", out[key])
        for key in out:
            if key.startswith("rollout_corr/"):  # bypass mode's correction, per micro-batch
                sums.add(key, out[key])
        return total

    return loss
