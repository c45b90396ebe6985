"""Rollout correction's settings and metric names, torch-free: the half of :mod:`hpcppo.algos.rollout_correction`
that the config compiler needs on a login node (validating ``[algorithm.rollout_correction]``, declaring the run's
``rollout_corr/*`` metric columns).

verl b178a3c, ``verl/trainer/ppo/rollout_corr_helper.py``: the IS levels (``compute_rollout_correction_weights``), the
rejection options and the parsing of their thresholds (``SUPPORTED_ROLLOUT_RS_OPTIONS``,
``_parse_rollout_rs_thresholds``), and the metrics each part reports (``compute_is_metrics``, ``compute_rs_metrics``,
``compute_rollout_rejection_mask``, ``compute_offpolicy_metrics``), all prefixed ``rollout_corr/``.
"""

from __future__ import annotations

import math

__all__ = ["IS_LEVELS", "RS_OPTIONS", "TOKEN_RS_OPTIONS", "LOSS_TYPES", "PREFIX", "RsThreshold", "parse_rollout_rs",
           "parse_rollout_rs_thresholds", "is_metric_names", "rs_metric_names", "offpolicy_metric_names",
           "metric_names"]

IS_LEVELS = ("token", "sequence")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
TOKEN_RS_OPTIONS = ("token_k1", "token_k2", "token_k3")
LOSS_TYPES = ("ppo_clip", "reinforce")  # bypass mode's losses (compute_policy_loss_bypass_mode)
PREFIX = "rollout_corr/"

RsThreshold = tuple[float | None, float]
"""``(lower, upper)`` of one rejection option: ratio bounds for the ``*_k1`` options, ``(None, upper)`` otherwise."""


def parse_rollout_rs(rollout_rs: str) -> tuple[str, ...]:
    """The options of a comma-separated ``rollout_rs`` (``"token_k1,seq_max_k2"``), duplicates dropped, in order;
    ``ValueError`` naming the allowed options for an unknown one."""
    if not isinstance(rollout_rs, str):
        raise ValueError(f"rollout_rs must be a string of comma-separated options, got {rollout_rs!r}")
    out: list[str] = []
    for opt in (part.strip() for part in rollout_rs.split(",")):
        if not opt:
            continue
        if opt not in RS_OPTIONS:
            raise ValueError(f"rollout_rs option {opt!r} is not one of {', '.join(RS_OPTIONS)}")
        if opt not in out:
            out.append(opt)
    if not out:
        raise ValueError("rollout_rs must name at least one option (" + ", ".join(RS_OPTIONS) + ")")
    return tuple(out)


def _number(spec: str, option: str) -> float:
    try:
        value = float(spec)
    except ValueError:
        raise ValueError(f"rollout_rs_threshold {spec!r} of option {option!r} is not a number") from None
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"rollout_rs_threshold of option {option!r} must be a positive number, got {spec!r}")
    return value


def parse_rollout_rs_thresholds(options: tuple[str, ...], threshold_spec: str | float | None
                                ) -> dict[str, RsThreshold]:
    """verl's ``_parse_rollout_rs_thresholds``: one threshold shared by every option or one per option
    (comma-separated). A ``*_k1`` option takes ``"lower_upper"`` ratio bounds, or one number: the upper bound, the
    lower its reciprocal; the others take one positive upper bound (no ``_``)."""
    if threshold_spec is None:
        raise ValueError("rollout_rs_threshold must be given with rollout_rs")
    if isinstance(threshold_spec, bool) or not isinstance(threshold_spec, int | float | str):
        raise ValueError(f"rollout_rs_threshold must be a number or a string, got {threshold_spec!r}")
    specs = ([str(threshold_spec)] if not isinstance(threshold_spec, str)
             else [p.strip() for p in threshold_spec.split(",") if p.strip()])
    if not specs:
        raise ValueError("rollout_rs_threshold must hold at least one threshold")
    if len(specs) not in (1, len(options)):
        raise ValueError(f"rollout_rs_threshold has {len(specs)} thresholds for {len(options)} rollout_rs options: "
                         "give one shared by all or one per option")
    if len(specs) == 1:
        specs = specs * len(options)
    out: dict[str, RsThreshold] = {}
    for option, spec in zip(options, specs):
        if option.endswith("k1"):
            lower_s, sep, upper_s = spec.partition("_")
            if sep:
                out[option] = (_number(lower_s, option), _number(upper_s, option))
            else:
                upper = _number(spec, option)
                out[option] = (1.0 / upper, upper)
        else:
            if "_" in spec:
                raise ValueError(f"rollout_rs_threshold of option {option!r} is one upper bound, without '_'; "
                                 f"got {spec!r}")
            out[option] = (None, _number(spec, option))
    return out


def is_metric_names(batch_normalize: bool) -> list[str]:
    """``compute_is_metrics``' keys (and ``rollout_is_batch_norm_factor`` with batch normalisation), unprefixed."""
    names = ["rollout_is_mean", "rollout_is_ratio_fraction_high", "rollout_is_ratio_fraction_low", "rollout_is_max",
             "rollout_is_min", "rollout_is_std", "rollout_is_eff_sample_size", "rollout_is_seq_mean",
             "rollout_is_seq_std", "rollout_is_seq_max", "rollout_is_seq_min", "rollout_is_seq_max_deviation",
             "rollout_is_seq_fraction_high", "rollout_is_seq_fraction_low"]
    return names + (["rollout_is_batch_norm_factor"] if batch_normalize else [])


def rs_metric_names(options: tuple[str, ...]) -> list[str]:
    """``compute_rs_metrics``' keys per option, each option's masked fractions, then the combined ones."""
    names: list[str] = []
    for opt in options:
        p = f"rollout_rs_{opt}"
        names += [f"{p}_{s}" for s in ("mean", "max", "min", "fraction_high", "fraction_low", "std", "seq_mean",
                                       "seq_std", "seq_max", "seq_min", "seq_max_deviation", "seq_fraction_high")]
        names += [f"{p}_seq_fraction_low"] if opt.endswith("k1") else []
        names += [f"{p}_masked_fraction", f"{p}_seq_masked_fraction"]
    return names + ["rollout_rs_masked_fraction", "rollout_rs_seq_masked_fraction"]


def offpolicy_metric_names() -> list[str]:
    """``compute_offpolicy_metrics``' keys (with rollout log-probs), unprefixed."""
    return ["training_ppl", "training_log_ppl", "kl", "k3_kl", "rollout_ppl", "rollout_log_ppl", "log_ppl_diff",
            "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio", "chi2_token", "chi2_seq"]


def metric_names(rollout_is: str | None, rollout_is_batch_normalize: bool, rollout_rs: str | None) -> list[str]:
    """Every ``rollout_corr/*`` metric of a correction with these settings, in verl's order."""
    names = is_metric_names(rollout_is_batch_normalize) if rollout_is is not None else []
    names += rs_metric_names(parse_rollout_rs(rollout_rs)) if rollout_rs is not None else []
    return [PREFIX + n for n in names + offpolicy_metric_names()]
