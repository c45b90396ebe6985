"""KL estimators, KL-coefficient controllers and the KL penalty in the reward (verl semantics).

Estimators are per token, of KL(actor || ref), from the log-probs of the sampled tokens (``[batch, response_len]``).
Controllers are small host-side objects: their state is plain Python (``float``/``int``/``str``) so a checkpoint
holding ``state_dict()`` loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

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
    """What the trainer needs from a KL-coefficient controller."""

    value: float

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _as_float(current_kl: float | torch.Tensor) -> float:
    """The controller's one host sync: a 0-d device tensor is read here, and only here."""
    return float(current_kl.detach()) if isinstance(current_kl, torch.Tensor) else float(current_kl)


def _positive(name: str, x: float) -> float:
    x = float(x)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {x}")
    return x


class _ControllerBase:
    """``value`` is the only state that evolves; hyperparameters come from the constructor (the config).

    ``state_dict`` records the hyperparameters too, for inspection; ``load_state_dict`` restores ``value`` only, so
    resuming with an edited config uses the new hyperparameters from the restored coefficient.
    """

    kind: str = ""
    value: float

    def _hyper(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state: ``{"kind", "value", <hyperparameters>}``."""
        return {"kind": self.kind, "value": float(self.value), **self._hyper()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``value`` from :meth:`state_dict` output; a state of another kind raises ``ValueError``."""
        kind = state.get("kind")
        if kind != self.kind:
            raise ValueError(f"KL controller state is for {kind!r}, this controller is {self.kind!r}")
        if "value" not in state:
            raise ValueError("KL controller state has no 'value'")
        self.value = float(state["value"])

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.state_dict().items() if k != "kind")
        return f"{type(self).__name__}({fields})"


class FixedKLController(_ControllerBase):
    """A constant coefficient; ``update`` does nothing (and reads nothing, so it never syncs)."""

    kind = "fixed"

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        """No-op."""


class AdaptiveKLController(_ControllerBase):
    """Ziegler et al. 2019 (verl's ``adaptive``): ``e = clip(kl/target - 1, -0.2, 0.2)``,
    ``value *= 1 + e * n_steps / horizon`` — the coefficient rises when KL is above target, falls when below."""

    kind = "adaptive"

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int | float):
        self.value = float(init_kl_coef)
        self.target = _positive("target_kl", target_kl)
        self.horizon = _positive("horizon", horizon)

    def _hyper(self) -> dict[str, Any]:
        return {"target_kl": self.target, "horizon": self.horizon}

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        """Move the coefficient towards the target. Syncs once if ``current_kl`` is a device tensor."""
        error = min(max(_as_float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


class StepKLController(_ControllerBase):
    """Bounded multiplicative controller: ``value *= factor`` when KL > target, ``/= factor`` when KL < target,
    unchanged when equal (or NaN), clamped to ``[min_coef, max_coef]``. ``n_steps`` is ignored.

    Not verl's; it is the rule the watchdog applies, offered as a controller under its honest name.
    """

    kind = "step"

    def __init__(
        self,
        init_kl_coef: float,
        target_kl: float,
        factor: float = 1.5,
        min_coef: float = 1e-4,
        max_coef: float = 10.0,
    ):
        self.target = _positive("target_kl", target_kl)
        self.factor = float(factor)
        if not (math.isfinite(self.factor) and self.factor > 1.0):
            raise ValueError(f"factor must be a finite number > 1, got {factor}")
        self.min_coef = _positive("min_coef", min_coef)
        self.max_coef = _positive("max_coef", max_coef)
        if self.min_coef > self.max_coef:
            raise ValueError(f"min_coef ({min_coef}) must not exceed max_coef ({max_coef})")
        init = float(init_kl_coef)
        if not self.min_coef <= init <= self.max_coef:
            raise ValueError(f"init_kl_coef {init} is outside [min_coef, max_coef] = [{min_coef}, {max_coef}]")
        self.value = init

    def _hyper(self) -> dict[str, Any]:
        return {"target_kl": self.target, "factor": self.factor, "min_coef": self.min_coef, "max_coef": self.max_coef}

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> None:
        """One multiplicative step. Syncs once if ``current_kl`` is a device tensor."""
        kl = _as_float(current_kl)
        if kl > self.target:
            self.value *= self.factor
        elif kl < self.target:
            self.value /= self.factor
        self.value = min(max(self.value, self.min_coef), self.max_coef)


KL_CONTROLLERS: dict[str, type[_ControllerBase]] = {
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
        return cls(**kwargs)  # type: ignore[return-value]
    except TypeError as exc:
        raise ValueError(f"KL controller {kind!r}: {exc}") from None


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: KLController,
    kind: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL penalty in the reward, as verl's ``apply_kl_penalty``: ``r = score - value * kl * mask``.

    Uses ``kl_ctrl.value`` *before* the update (read it before calling to log the coefficient used), then calls
    ``kl_ctrl.update(current_kl, n_steps=batch)``. ``current_kl`` is the batch mean of each sequence's masked mean
    KL. The only host sync is inside the adaptive/step controllers' ``update``; a fixed controller never syncs.

    Args:
        token_level_scores: ``[B, T]`` rewards from the reward function.
        old_log_prob, ref_log_prob: ``[B, T]`` log-probs of the rollout policy and the reference.
        response_mask: ``[B, T]``.

    Returns:
        ``token_level_rewards`` ``[B, T]`` (compute dtype) and ``current_kl`` (0-d tensor).
    """
    with torch.no_grad():
        dtype = compute_dtype(token_level_scores, old_log_prob, ref_log_prob)
        kld = kl_penalty(old_log_prob, ref_log_prob, kind) * response_mask.to(dtype)
        rewards = token_level_scores.to(dtype) - kl_ctrl.value * kld
        current_kl = masked_mean(kld, response_mask, axis=-1).mean(dim=0)
    kl_ctrl.update(current_kl, n_steps=token_level_scores.shape[0])
    return rewards, current_kl
