"""``[algorithm.rollout_correction]``: importance weights and rejection for the gap between the rollout engine's
policy and the trainer's, with verl's names and defaults (verl b178a3c, ``verl/trainer/config/algorithm.py``
``RolloutCorrectionConfig``, ``algorithm/rollout_correction.yaml``; the math: :mod:`hpcppo.algos.rollout_correction`).

Everything is off by default, as in verl's YAML. Unlike verl, where the ``rollout_corr/*`` metrics appear whenever the
rollout's log-probs are kept (``rollout.calculate_log_probs``), hpcppo computes and logs them when the section turns
something on (``rollout_is``, ``rollout_rs`` or ``bypass_mode``): hpcppo always keeps the engine's log-probs, so a run
that asks for nothing pays nothing and its columns stay as they were.
"""

from __future__ import annotations

from typing import Any

import attrs

from hpcppo import rollout_corr
from hpcppo.config.fields import FieldValueError, opt

__all__ = ["RolloutCorrectionSection", "correction_on", "metric_columns"]


def _check_rs(value: str) -> str | None:
    try:
        rollout_corr.parse_rollout_rs(value)
    except ValueError as exc:
        return str(exc)
    return None


@attrs.frozen(kw_only=True)
class RolloutCorrectionSection:
    """``[algorithm.rollout_correction]``: verl's rollout correction (IS weights, rejection, bypass mode)."""

    rollout_is: str | None = opt(None, choices=rollout_corr.IS_LEVELS,
                                 help="IS weights pi_train / pi_rollout (recomputed old log-probs over the engine's): "
                                      "token = one per token (biased, low variance), sequence = their product over "
                                      "the response (unbiased, high variance), multiplying each token's policy loss "
                                      "in every loss mode; unset = none.")
    rollout_is_threshold: float = opt(2.0, gt=0.0, help="Truncation of the IS weights: min(w, threshold) (no lower "
                                                        "bound); also the bound of the rollout_is_ratio_fraction_* "
                                                        "metrics (its reciprocal below).")
    rollout_is_batch_normalize: bool = opt(False, help="Divide the truncated IS weights by their mean over the "
                                                       "whole batch (all ranks; over tokens, or over sequences), so "
                                                       "they average 1.")
    rollout_rs: str | None = opt(None, check=_check_rs,
                                 allowed="comma-separated: " + ", ".join(rollout_corr.RS_OPTIONS),
                                 help="Rejection: tokens (token_*) or whole sequences (seq_sum_*, seq_mean_*, "
                                      "seq_max_*) whose divergence estimate of log r fails its threshold leave the "
                                      "loss masks (and the advantages); k1 = -log r within ratio bounds, k2 = "
                                      "(log r)^2 / 2, k3 = r - 1 - log r below a bound; several options must all "
                                      "pass; unset = none.")
    rollout_rs_threshold: str | float | None = opt(None, help="Thresholds of rollout_rs: one shared by every option "
                                                              "or one per option, comma-separated; a k1 option takes "
                                                              "\"lower_upper\" ratio bounds (one number: the upper, "
                                                              "its reciprocal the lower), the others one positive "
                                                              "upper bound.")
    bypass_mode: bool = opt(False, help="Use the engine's log-probs as the old log-probs (the old-log-prob pass is "
                                        "skipped: two policies instead of three); the correction then runs in the "
                                        "policy loss on the current policy against the rollout, with loss_type.")
    loss_type: str = opt("ppo_clip", choices=rollout_corr.LOSS_TYPES,
                         help="bypass_mode's loss: ppo_clip = PPO's clipped ratio pi_theta / pi_rollout (IS weights "
                              "not applied: the ratio is the correction), reinforce = -w x A x log pi_theta with the "
                              "IS weights w.")

    def __attrs_post_init__(self) -> None:
        if self.rollout_rs is not None:
            options = rollout_corr.parse_rollout_rs(self.rollout_rs)
            try:
                rollout_corr.parse_rollout_rs_thresholds(options, self.rollout_rs_threshold)
            except ValueError as exc:
                raise FieldValueError("rollout_rs_threshold", str(exc)) from None
        elif self.rollout_rs_threshold is not None:
            raise FieldValueError("rollout_rs_threshold", "does nothing without rollout_rs")
        if not self.bypass_mode and self.loss_type != "ppo_clip":
            raise FieldValueError("loss_type", "chooses bypass_mode's loss and does nothing without bypass_mode = true")
        if self.rollout_is is None and self.rollout_is_threshold != 2.0:
            raise FieldValueError("rollout_is_threshold", "truncates the IS weights and does nothing without rollout_is")
        if self.rollout_is is None and self.rollout_is_batch_normalize:
            raise FieldValueError("rollout_is_batch_normalize", "normalises the IS weights and does nothing without "
                                                                "rollout_is")


def correction_on(section: Any) -> bool:
    """Whether the section asks for anything (weights, rejection or bypass mode): the trainer's phase runs then."""
    return section.rollout_is is not None or section.rollout_rs is not None or bool(section.bypass_mode)


def metric_columns(section: Any) -> list[str]:
    """The ``rollout_corr/*`` columns a run with this section logs (none when it is off)."""
    if not correction_on(section):
        return []
    return rollout_corr.metric_names(section.rollout_is, section.rollout_is_batch_normalize, section.rollout_rs)


# The paragraph of docs/verl.md (hpcppo.verl.importer.render_doc) about this section.
VERL_DOC = """**Rollout correction** (`algorithm.rollout_correction.*`, the same names in hpcppo): verl's importance weights
and rejection for the gap between the engine's policy and the trainer's (`verl/trainer/ppo/rollout_corr_helper.py`;
`docs/algo/rollout_corr.md`). hpcppo always keeps the engine's log-probs, so `rollout.calculate_log_probs` is not
needed. With `bypass_mode = false` (decoupled, three policies) the weights `pi_old / pi_rollout` (`rollout_is`:
`token` or `sequence`, truncated at `rollout_is_threshold`, optionally divided by their batch mean) and the
rejections (`rollout_rs`, with `rollout_rs_threshold`: `token_k1..3`, `seq_sum_k1..3`, `seq_mean_k1..3`,
`seq_max_k2/3`, comma-separated, all must pass) are computed once per step on the whole batch after the KL penalty;
rejected tokens leave the response mask of the advantages, the critic and the actor, and the weights multiply each
token's policy loss in every `loss_mode` (`geo_mean`: their per-sequence geometric mean), as verl's
`rollout_is_weights`. With `bypass_mode = true` the engine's log-probs are the old log-probs (no old-log-prob pass) and the policy loss is
verl's `bypass_mode`: `loss_type = "ppo_clip"` (PPO against the rollout, the weights not applied) or `"reinforce"`
(`-w A log pi`); another `loss_mode` with bypass mode is refused (verl silently replaces it). The `rollout_corr/*`
metrics are verl's names; they are logged when the section turns something on (verl logs the off-policy ones whenever
it keeps the rollout's log-probs). Two differences: verl's actor, on one mini-batch and one epoch, takes the current
log-probs for the old ones (`on_policy` in `dp_actor.update_policy`), which in bypass mode makes every weight 1;
hpcppo keeps the rollout's. In decoupled mode verl's actor re-logs the off-policy metrics per micro-batch against the
current policy under the same names; hpcppo logs the batch's (`pi_old` against `pi_rollout`).
"""
