"""KL estimators, KL-coefficient controllers and the KL penalty in the reward (verl semantics).

Estimators are per token, of KL(actor || ref), from the log-probs of the sampled tokens (``[batch, response_len]``).
Controllers are frozen rules: ``next_coef(coef, step's KL) -> next coef`` is a pure function, and the coefficient
itself has one holder, the training state (``TrainingState.kl_coef``). The checkpoint's ``kl_ctrl`` entry
(``state_dict(coef)``) is plain Python (``float``/``int``/``str``), so it loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from hpcppo.algos.stats import compute_dtype, masked_mean

__all__ = [
    "KL_CONTROLLERS",
    "KL_KINDS",
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "StepKLController",
    "apply_kl_penalty",
    "build_kl_controller",
    "kl_penalty",
]

_BASE_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_KINDS: tuple[str, ...] = _BASE_KINDS + tuple(k + "+" for k in _BASE_KINDS)


def _kl_forward(diff: torch.Tensor, kind: str) -> torch.Tensor:
    """The estimator's value from ``diff = logp - ref``."""
    if kind in ("kl", "k1"):
        return diff
    if kind == "abs":
        return diff.abs()
    if kind in ("mse", "k2"):
        return 0.5 * diff.square()
    # k3 (Schulman 2020): exp(ref - logp) - (ref - logp) - 1, clamped for stability as verl does.
    k = torch.clamp(-diff, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(k) - k - 1.0, min=-10.0, max=10.0)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` (float32, or float64 for float64 inputs), differentiable.

    Kinds: ``kl``/``k1`` = ``logp - ref``; ``abs`` = ``|logp - ref|``; ``mse``/``k2`` = ``0.5 (logp - ref)^2``;
    ``low_var_kl``/``k3`` = ``clamp(exp(k) - k - 1, -10, 10)`` with ``k = clamp(ref - logp, -20, 20)``. A trailing
    ``+`` (e.g. ``k3+``) keeps the base estimator's value but takes k2's gradient (straight-through), which is the
    unbiased gradient of the KL (verl PR #2953; verl's own ``kl_penalty_forward`` does not strip the ``+`` and
    raises ``NotImplementedError`` for these names, so this implements its documented intent).

    Raises:
        ValueError: unknown ``kind`` (the message lists the known ones).
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL estimator {kind!r}; known: {', '.join(KL_KINDS)}")
    dtype = compute_dtype(log_prob, ref_log_prob)
    diff = log_prob.to(dtype) - ref_log_prob.to(dtype)
    base = kind.rstrip("+")
    forward = _kl_forward(diff, base)
    if not kind.endswith("+") or base in ("mse", "k2"):
        return forward
    k2 = 0.5 * diff.square()
    # Value: forward (k2 - k2 is exactly 0). Gradient: k2's.
    return k2 - k2.detach() + forward.detach()


class KLController(Protocol):
    """A KL-coefficient controller: a rule, not a holder. The coefficient is the training state's
    (``TrainingState.kl_coef``); the controller says what it starts at and what it becomes after a step's KL."""

    kind: ClassVar[str]

    @property
    def initial(self) -> float:
        """The coefficient of step 1 (``[algorithm.kl_ctrl] kl_coef``)."""
        ...

    def next_coef(self, coef: float, current_kl: float | torch.Tensor, n_steps: int) -> float:
        """The coefficient after a step that used ``coef`` and measured ``current_kl`` over ``n_steps`` sequences."""
        ...

    def state_dict(self, coef: float) -> dict[str, Any]:
        """The checkpoint's ``kl_ctrl`` entry for coefficient ``coef``: ``{"kind", "value", <hyperparameters>}``."""
        ...

    def coef_from_state(self, state: Mapping[str, Any]) -> float:
        """The coefficient a checkpoint's ``kl_ctrl`` entry holds (its ``value``); another kind raises ``ValueError``."""
        ...


def _as_float(current_kl: float | torch.Tensor) -> float:
    """The controller's one host sync: a 0-d device tensor is read here, and only here."""
    return float(current_kl.detach()) if isinstance(current_kl, torch.Tensor) else float(current_kl)


def _positive(name: str, x: float) -> float:
    x = float(x)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {x}")
    return x


class _ControllerBase:
    """The checkpoint format every controller shares. Hyperparameters come from the config; ``state_dict`` records
    them too, for inspection, and ``coef_from_state`` reads ``value`` only, so resuming with an edited config uses
    the new hyperparameters from the restored coefficient. The format is the one the controllers had when they held
    the coefficient themselves, so checkpoints of either age read the same."""

    kind: ClassVar[str] = ""

    def _hyper(self) -> dict[str, Any]:
        return {}

    def state_dict(self, coef: float) -> dict[str, Any]:
        return {"kind": self.kind, "value": float(coef), **self._hyper()}

    def coef_from_state(self, state: Mapping[str, Any]) -> float:
        kind = state.get("kind")
        if kind != self.kind:
            raise ValueError(f"KL controller state is for {kind!r}, this controller is {self.kind!r}")
        if "value" not in state:
            raise ValueError("KL controller state has no 'value'")
        return float(state["value"])


@dataclass(frozen=True)
class FixedKLController(_ControllerBase):
    """A constant coefficient: ``next_coef`` returns the one it is given (which the watchdog may have raised) and
    reads no KL, so it never syncs."""

    kl_coef: float
    kind: ClassVar[str] = "fixed"

    def __post_init__(self) -> None:
        object.__setattr__(self, "kl_coef", float(self.kl_coef))

    @property
    def initial(self) -> float:
        return self.kl_coef

    def next_coef(self, coef: float, current_kl: float | torch.Tensor, n_steps: int) -> float:
        return float(coef)


@dataclass(frozen=True)
class AdaptiveKLController(_ControllerBase):
    """Ziegler et al. 2019 (verl's ``adaptive``): ``e = clip(kl/target - 1, -0.2, 0.2)``,
    ``coef x (1 + e * n_steps / horizon)`` — the coefficient rises when KL is above target, falls when below."""

    init_kl_coef: float
    target_kl: float
    horizon: float
    kind: ClassVar[str] = "adaptive"

    def __post_init__(self) -> None:
        object.__setattr__(self, "init_kl_coef", float(self.init_kl_coef))
        object.__setattr__(self, "target_kl", _positive("target_kl", self.target_kl))
        object.__setattr__(self, "horizon", _positive("horizon", self.horizon))

    @property
    def initial(self) -> float:
        return self.init_kl_coef

    def _hyper(self) -> dict[str, Any]:
        return {"target_kl": self.target_kl, "horizon": self.horizon}

    def next_coef(self, coef: float, current_kl: float | torch.Tensor, n_steps: int) -> float:
        """Towards the target. Syncs once if ``current_kl`` is a device tensor."""
        error = min(max(_as_float(current_kl) / self.target_kl - 1.0, -0.2), 0.2)
        return float(coef) * (1.0 + error * n_steps / self.horizon)


@dataclass(frozen=True)
class StepKLController(_ControllerBase):
    """Bounded multiplicative controller: ``coef x factor`` when KL > target, ``/ factor`` when KL < target,
    unchanged when equal (or NaN), clamped to ``[min_coef, max_coef]``. ``n_steps`` is ignored.

    Not verl's; it is the rule the watchdog applies, offered as a controller under its honest name.
    """

    init_kl_coef: float
    target_kl: float
    factor: float = 1.5
    min_coef: float = 1e-4
    max_coef: float = 10.0
    kind: ClassVar[str] = "step"

    def __post_init__(self) -> None:
        set_ = functools.partial(object.__setattr__, self)
        set_("target_kl", _positive("target_kl", self.target_kl))
        factor, min_coef, max_coef = self.factor, self.min_coef, self.max_coef
        set_("factor", float(factor))
        if not (math.isfinite(self.factor) and self.factor > 1.0):
            raise ValueError(f"factor must be a finite number > 1, got {factor}")
        set_("min_coef", _positive("min_coef", min_coef))
        set_("max_coef", _positive("max_coef", max_coef))
        if self.min_coef > self.max_coef:
            raise ValueError(f"min_coef ({min_coef}) must not exceed max_coef ({max_coef})")
        set_("init_kl_coef", float(self.init_kl_coef))
        if not self.min_coef <= self.init_kl_coef <= self.max_coef:
            raise ValueError(f"init_kl_coef {self.init_kl_coef} is outside [min_coef, max_coef] = "
                             f"[{min_coef}, {max_coef}]")

    @property
    def initial(self) -> float:
        return self.init_kl_coef

    def _hyper(self) -> dict[str, Any]:
        return {"target_kl": self.target_kl, "factor": self.factor, "min_coef": self.min_coef,
                "max_coef": self.max_coef}

    def next_coef(self, coef: float, current_kl: float | torch.Tensor, n_steps: int) -> float:
        """One multiplicative step. Syncs once if ``current_kl`` is a device tensor."""
        kl, value = _as_float(current_kl), float(coef)
        if kl > self.target_kl:
            value *= self.factor
        elif kl < self.target_kl:
            value /= self.factor
        return min(max(value, self.min_coef), self.max_coef)


KL_CONTROLLERS: dict[str, Callable[..., KLController]] = {
    "fixed": FixedKLController,
    "adaptive": AdaptiveKLController,
    "step": StepKLController,
}


def build_kl_controller(kind: str, **kwargs: Any) -> KLController:
    """Build a controller by name: ``fixed(kl_coef)``, ``adaptive(init_kl_coef, target_kl, horizon)``,
    ``step(init_kl_coef, target_kl, factor, min_coef, max_coef)``.

    Raises:
        ValueError: unknown ``kind`` (listing the known ones) or arguments the controller does not take.
    """
    cls = KL_CONTROLLERS.get(kind)
    if cls is None:
        raise ValueError(f"unknown KL controller {kind!r}; known: {', '.join(KL_CONTROLLERS)}")
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"KL controller {kind!r}: {exc}") from None


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kind: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL penalty in the reward, as verl's ``apply_kl_penalty``: ``r = score - kl_coef * kl * mask``.

    ``current_kl`` is the batch mean of each sequence's masked mean KL: the controller's input for the next
    coefficient (``next_coef(kl_coef, current_kl, n_steps=batch)``, as verl's driver calls ``kl_ctrl.update``). No
    host sync here; the adaptive/step controllers read ``current_kl`` once, a fixed one never.

    Args:
        token_level_scores: ``[B, T]`` rewards from the reward function.
        old_log_prob, ref_log_prob: ``[B, T]`` log-probs of the rollout policy and the reference.
        response_mask: ``[B, T]``.
        kl_coef: this step's coefficient (the training state's).

    Returns:
        ``token_level_rewards`` ``[B, T]`` (compute dtype) and ``current_kl`` (0-d tensor).
    """
    with torch.no_grad():
        dtype = compute_dtype(token_level_scores, old_log_prob, ref_log_prob)
        kld = kl_penalty(old_log_prob, ref_log_prob, kind) * response_mask.to(dtype)
        rewards = token_level_scores.to(dtype) - kl_coef * kld
        current_kl = masked_mean(kld, response_mask, axis=-1).mean(dim=0)
    return rewards, current_kl
