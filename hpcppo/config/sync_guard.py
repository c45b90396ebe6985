"""The weight-sync guard's limit: how far the rollout engine's log-probs of a step's own samples may sit from the
trainer's before the run stops (``rollout.logprob_gap_max``; the trainer checks it, :mod:`hpcppo.train.trainer`).

The measure is ``rollout/logprob_gap``: the mean over response tokens of ``|engine log-prob - trainer log-prob|``
of the tokens the engine sampled, right after the engine received the actor's weights. An engine that holds the
actor's weights differs from the trainer only by rounding, which depends on the dtypes both compute in: the
engine runs in ``model.dtype``, the trainer in the actor's FSDP ``param_dtype`` (``model.dtype`` unless set). The
defaults and the measurements behind them are in ``docs/sync-guard.md``.
"""

from __future__ import annotations

import math

__all__ = ["FULL_PRECISION_GAP_MAX", "HALF_PRECISION_GAP_MAX", "default_logprob_gap_max", "logprob_gap_max",
           "gap_verdict"]

# Measured on healthy runs of the tiny model (docs/sync-guard.md): both sides in float32, at most 2.4e-7 (HF
# engine) and 5.2e-7 (vLLM's CPU backend); a sync that misses one MLP weight, 0.064.
FULL_PRECISION_GAP_MAX = 1e-3
# A bfloat16 engine against a float32 trainer: at most 0.0064 (HF) and 0.0056 (vLLM); bfloat16 on both sides with
# vLLM, 0.0060. About eight times the largest healthy gap measured.
HALF_PRECISION_GAP_MAX = 0.05


def default_logprob_gap_max(engine_dtype: str, trainer_dtype: str) -> tuple[float, str]:
    """The default limit for an engine computing in ``engine_dtype`` against a trainer in ``trainer_dtype``, and
    where it comes from (for the plan and the stop message)."""
    pair = f"{engine_dtype} engine, {trainer_dtype} trainer"
    if engine_dtype == trainer_dtype == "float32":
        return FULL_PRECISION_GAP_MAX, f"the default for a {pair}"
    return HALF_PRECISION_GAP_MAX, f"the default for a {pair}"


def logprob_gap_max(value: float, engine_dtype: str, trainer_dtype: str, *, engine: str = "hf", top_p: float = 1.0,
                    top_k: int = -1) -> tuple[float, str]:
    """The limit in effect: ``value`` (``rollout.logprob_gap_max``) when set, else the dtype pair's default;
    ``-1`` switches the guard off (kept as -1: a resolved plan holds finite numbers only).

    vLLM may report its log-probs after top-k/top-p truncation (``hpcppo.rollout.vllm_engine``'s notes: it depends on
    the version and the model runner), renormalised over the tokens kept: ``log p - log(kept mass)``. With top-p the
    kept mass is at least ``top_p``, so the default grows by ``-log(top_p)``; top-k has no such bound, so with top-k
    on vLLM the default is off (a limit set in the spec still applies). The HF engine reports them before truncation.
    """
    if value < 0.0:
        return -1.0, "rollout.logprob_gap_max = -1: the guard is off"
    if value > 0.0:
        return value, "rollout.logprob_gap_max"
    limit, source = default_logprob_gap_max(engine_dtype, trainer_dtype)
    if engine == "vllm" and top_k != -1:
        return -1.0, (f"off by default with rollout.top_k = {top_k} on vllm: its log-probs may be taken after the "
                      "top-k truncation, so the gap does not measure the sync; set rollout.logprob_gap_max to check it")
    if engine == "vllm" and top_p < 1.0:
        extra = -math.log(top_p)
        return limit + extra, f"{source}, plus -log(rollout.top_p) = {extra:.4g} for vLLM's log-probs after top-p"
    return limit, source


def gap_verdict(gap: float, limit: float, source: str, *, step: int, engine: str) -> str | None:
    """The one line that stops the run when the engine and the trainer disagree (None when they agree).

    A negative ``limit`` is the guard switched off. A NaN gap counts as a disagreement: a comparison with NaN is
    never "within the limit"."""
    if limit < 0.0 or gap <= limit:
        return None
    return (f"the rollout engine ({engine}) and the trainer disagree after the weight sync of step {step}: their "
            f"log-probs of the step's own samples differ by {gap:.4g} per token on average (rollout/logprob_gap), "
            f"above {limit:.4g} ({source}); the engine is not sampling from the actor's weights, so the run stops "
            f"before this step's update. Set rollout.logprob_gap_max to accept a larger gap, or try "
            f"rollout.engine = \"hf\"")
