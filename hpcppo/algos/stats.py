"""Masked statistics and the reverse linear scan shared by the advantage estimators.

Semantics follow verl's ``verl/utils/torch_functional.py``. All shapes are ``[batch, response_len]`` unless said
otherwise; ``mask`` is the response mask (1 on response tokens, 0 elsewhere; bool, int or float).

Precision policy of the whole package: low-precision floating inputs (bf16/fp16) are computed in float32, float64
inputs stay float64, and results come back in that compute dtype. Masks are converted to the compute dtype before
they are summed (a bf16 sum of a million ones is not a million).

Host syncs: nothing here calls ``.item()`` or branches on tensor data, with one documented exception: the checks
that verl performs by raising (a variance over fewer than two tokens) raise ``ValueError`` when the mask lives on the
CPU, where reading it costs nothing. On an accelerator the same condition yields NaN instead of forcing a device
sync; the NaN then reaches the logged losses, where the watchdog sees it.
"""

from __future__ import annotations

import torch

__all__ = [
    "compute_dtype",
    "explained_variance",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "reverse_linear_scan",
]


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """The dtype the math runs in: float64 if any floating input is float64, else float32."""
    for t in tensors:
        if t is not None and t.dtype == torch.float64:
            return torch.float64
    return torch.float32


def _on_host(t: torch.Tensor) -> bool:
    """True when reading ``t``'s data needs no device synchronisation."""
    return t.device.type == "cpu"


def _axis_sum(x: torch.Tensor, axis: int | tuple[int, ...] | None) -> torch.Tensor:
    return x.sum() if axis is None else x.sum(dim=axis)


def masked_sum(
    values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is non-zero; NaN/inf outside the mask never leak in.

    Args:
        values: ``[...]`` any shape.
        mask: same shape as ``values``.
        axis: dimension(s) to reduce; ``None`` reduces everything to a 0-d tensor.
    """
    dtype = compute_dtype(values)
    m = mask.to(dtype)
    # ``where`` first: 0 * NaN is NaN, so multiplying alone would let masked garbage through.
    valid = torch.where(mask.bool(), values.to(dtype), torch.zeros((), dtype=dtype, device=values.device))
    return _axis_sum(valid * m, axis)


def masked_mean(
    values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """``sum(values * mask) / (sum(mask) + 1e-8)`` over ``axis`` (verl's definition; an empty mask gives 0)."""
    dtype = compute_dtype(values)
    return masked_sum(values, mask, axis) / (_axis_sum(mask.to(dtype), axis) + 1e-8)


def _check_count(count: torch.Tensor, what: str) -> torch.Tensor:
    """Raise like verl when ``count`` (a 0-d token count) is 0 or 1 and that costs no sync.

    Returns a bool 0-d tensor, True where the count is valid, for callers that must poison the result with NaN
    on accelerators instead of raising.
    """
    if _on_host(count):
        n = float(count)
        if n == 0:
            raise ValueError(f"{what}: the mask selects no token; at least two are needed for an unbiased variance")
        if n == 1:
            raise ValueError(
                f"{what}: the mask selects a single token; an unbiased variance needs at least two "
                "(use a larger mini-batch)"
            )
    return count > 1


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over the whole mask (a 0-d tensor).

    With ``unbiased=True`` (verl's default) the biased estimate is multiplied by ``n / (n - 1)``; a mask selecting
    0 or 1 tokens raises ``ValueError`` on CPU and gives NaN on accelerators (see the module docstring).
    """
    dtype = compute_dtype(values)
    mean = masked_mean(values, mask)
    centered = values.to(dtype) - mean
    variance = masked_mean(centered * centered, mask)
    if unbiased:
        n = mask.to(dtype).sum()
        ok = _check_count(n, "masked_var")
        nan = torch.full((), float("nan"), dtype=dtype, device=variance.device)
        variance = torch.where(ok, variance * (n / (n - 1)), nan)
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(values - mean) * rsqrt(var + 1e-8)`` at every position, statistics over the masked tokens.

    With ``shift_mean=False`` the mean is added back: ``(values - mean) / std + mean``. Positions outside the mask
    are transformed too (callers multiply by the mask where they need zeros there).
    """
    dtype = compute_dtype(values)
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values.to(dtype) - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``1 - var(returns - values) / (var(returns) + 1e-5)`` over the masked tokens (0-d tensor).

    Matches verl's ``critic/vf_explained_var`` (unbiased variances of the selected tokens). It is a metric, so it
    never raises: fewer than two masked tokens give NaN, as ``torch.var`` does there.
    """
    dtype = compute_dtype(values, returns)
    r = returns.to(dtype)
    n = mask.to(dtype).sum()
    ok = n > 1
    bessel = torch.where(ok, n / (n - 1), torch.full((), float("nan"), dtype=dtype, device=n.device))

    def var(x: torch.Tensor) -> torch.Tensor:
        centered = x - masked_mean(x, mask)
        return masked_mean(centered * centered, mask) * bessel

    return 1.0 - var(r - values.to(dtype)) / (var(r) + 1e-5)


def reverse_linear_scan(x: torch.Tensor, coef: torch.Tensor | float) -> torch.Tensor:
    """Solve ``y[:, t] = x[:, t] + coef[:, t] * y[:, t + 1]`` with ``y[:, T] = 0`` along the last dimension.

    This is the reverse recurrence behind GAE and discounted returns. Instead of ``T`` sequential steps (about
    ``5 * T`` kernel launches in verl's loop) it uses a log-depth doubling scan: after the step with offset ``s``
    every position holds the sum over the next ``2 * s`` terms and ``coef`` the product linking it to ``t + 2 * s``;
    ``ceil(log2 T)`` steps of a handful of element-wise kernels each, no data-dependent shapes.

    Args:
        x: ``[..., T]`` floating tensor.
        coef: ``[..., T]`` tensor broadcastable to ``x``, or a Python float (a constant discount).

    Returns:
        ``y``: ``[..., T]``, same dtype as ``x``.
    """
    length = x.shape[-1]
    y = x
    if isinstance(coef, float | int):
        # Constant discount: the combined coefficient after k doublings is coef ** (2 ** k), exact on the host.
        g = float(coef)
        step = 1
        while step < length:
            if g == 0.0:
                break
            head = torch.add(y[..., :-step], y[..., step:], alpha=g)
            y = torch.cat([head, y[..., -step:]], dim=-1)
            g = g * g
            step *= 2
        return y
    c = coef.to(x.dtype).expand_as(x)
    step = 1
    while step < length:
        head = torch.addcmul(y[..., :-step], c[..., :-step], y[..., step:])
        y = torch.cat([head, y[..., -step:]], dim=-1)
        # Beyond the end y is 0, so the tail coefficients no longer matter: keep them as they are.
        c = torch.cat([c[..., :-step] * c[..., step:], c[..., -step:]], dim=-1)
        step *= 2
    return y
