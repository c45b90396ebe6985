"""The trainer's rollout-correction phase (``[algorithm.rollout_correction]``, verl's ``rollout_correction``).

Where verl b178a3c puts it (``verl/trainer/ppo/ray_trainer.py``, ``fit``):

* **decoupled mode** (``bypass_mode = false``): after the KL penalty and before the advantages, on the whole batch
  (verl's driver; here every rank holds the gathered batch, so the batch normalisation is over all ranks without a
  collective): the IS weights ``rollout_is_weights`` join the batch and the rejected tokens leave its
  ``response_mask``, which the advantages, the critic's loss and the actor's loss then use
  (``compute_rollout_correction_and_add_to_batch``);
* **bypass mode**: the engine's log-probs are the old log-probs (no old-log-prob pass, ``apply_bypass_mode``), and
  the policy loss ``bypass_mode`` corrects each micro-batch (its batch normalisation sums over ranks with
  :func:`all_reduce_sum`).

The batch-level metrics (``response/length_mean`` ...) keep the rollout's mask; the correction's are
``rollout_corr/*`` (decoupled: ``pi_old`` against ``pi_rollout`` over the batch; bypass: ``pi_theta`` against
``pi_rollout``, averaged over micro-batches and ranks). verl's actor also logs, in decoupled mode, the current policy
against the rollout under the same names per micro-batch (``compute_rollout_corr_metrics_from_logprobs``), which
then replace the batch's; hpcppo keeps the batch's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from hpcppo import algos
from hpcppo.config.rollout_corr import correction_on

__all__ = ["params", "bypass", "decoupled", "all_reduce_sum"]


def params(section: Any) -> algos.RolloutCorrectionParams | None:
    """The section as the algos' plain values, or None when it asks for nothing."""
    if not correction_on(section):
        return None
    return algos.RolloutCorrectionParams(
        rollout_is=section.rollout_is, rollout_is_threshold=section.rollout_is_threshold,
        rollout_is_batch_normalize=section.rollout_is_batch_normalize, rollout_rs=section.rollout_rs,
        rollout_rs_threshold=section.rollout_rs_threshold, bypass_mode=section.bypass_mode,
        loss_type=section.loss_type)


def bypass(section: Any) -> bool:
    """Whether the old log-probs are the engine's (no old-log-prob pass; the loss corrects)."""
    return bool(section.bypass_mode)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """The sum of ``t`` over all ranks (a new tensor): the batch normalisation of the bypass loss's weights."""
    out = t.detach().clone()
    if dist.is_initialized():
        dist.all_reduce(out)
    return out


def decoupled(full: Mapping[str, torch.Tensor], section: Any) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The correction of the gathered batch: ``{"response_mask": <with rejections>, "rollout_is_weights": ...}``
    (weights only with ``rollout_is``) and the ``rollout_corr/*`` metrics, the same on every rank. Nothing (``{}``)
    when the section asks for nothing or runs in bypass mode."""
    p = params(section)
    if p is None or p.bypass_mode:
        return {}, {}
    weights, mask, metrics = algos.compute_rollout_correction_and_rejection_mask(
        full["old_log_probs"], full["rollout_log_probs"], full["response_mask"], p.rollout_is,
        p.rollout_is_threshold, p.rollout_is_batch_normalize, p.rollout_rs, p.rollout_rs_threshold)
    out = {"response_mask": mask}
    if weights is not None:
        out["rollout_is_weights"] = weights
    values = torch.stack([v.to(torch.float64) for v in metrics.values()]).tolist()  # one host copy
    return out, dict(zip(metrics, values))
