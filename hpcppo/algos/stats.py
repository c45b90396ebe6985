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

import math

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
    """Solve ``y[..., t] = x[..., t] + coef[..., t] * y[..., t + 1]`` with ``y[..., T] = 0`` (last dimension).

    This is the reverse recurrence behind GAE and discounted returns. verl runs it as ``T`` sequential steps of
    batch-vectorised ops (about ``6 * T`` kernel launches). Here it is a two-level blocked scan with ``O(B * T)``
    work and about ``2 * sqrt(T)`` sequential steps: the time axis is cut into ``n`` chunks of ``C ~ sqrt(T)``;

    1. every chunk is scanned locally (as if ``y`` after it were 0) — ``C`` steps, all chunks and rows at once —
       while the product of coefficients from each position to the chunk's end is accumulated;
    2. the chunk starts are chained right to left — ``n`` steps on ``[B]`` vectors;
    3. each position adds its coefficient product times the next chunk's start value — one broadcast op.

    No data-dependent shapes or host reads.

    Args:
        x: ``[..., T]`` floating tensor.
        coef: tensor broadcastable to ``x``, or a Python float (a constant discount).

    Returns:
        ``y``: ``[..., T]``, same dtype as ``x``.
    """
    shape = x.shape
    length = shape[-1]
    if length == 0:
        return x.clone()
    if isinstance(coef, float | int):
        coef = torch.full((), float(coef), dtype=x.dtype, device=x.device)
    x2 = x.reshape(-1, length)
    c2 = coef.to(x.dtype).expand(shape).reshape(-1, length)
    rows = x2.shape[0]
    chunk = max(1, math.isqrt(length - 1) + 1) if length > 1 else 1
    n_chunks = -(-length // chunk)
    pad = n_chunks * chunk - length
    if pad:
        # Padding with x = 0, coef = 0 makes y = 0 past the end, as the recurrence requires.
        x2 = torch.nn.functional.pad(x2, (0, pad))
        c2 = torch.nn.functional.pad(c2, (0, pad))
    # Time-major layout [n_chunks, chunk, rows]: step i reads n_chunks contiguous blocks of ``rows`` values. A 2-D
    # transpose copy has a fast blocked kernel; a 3-D permute of [rows, n_chunks, chunk] does not (measured ~5x).
    xs = x2.t().contiguous().view(n_chunks, chunk, rows)
    cs = c2.t().contiguous().view(n_chunks, chunk, rows)

    local = [xs[:, chunk - 1]]
    prod = [cs[:, chunk - 1]]  # prod[i] = coef product linking position i to the next chunk's first position
    for i in range(chunk - 2, -1, -1):
        local.append(torch.addcmul(xs[:, i], cs[:, i], local[-1]))
        prod.append(cs[:, i] * prod[-1])
    local_t = torch.stack(local[::-1], dim=1)  # [n_chunks, chunk, rows]
    prod_t = torch.stack(prod[::-1], dim=1)

    # y at the first position of each chunk, chained from the last chunk backwards.
    starts = [local_t[n_chunks - 1, 0]]
    for j in range(n_chunks - 2, -1, -1):
        starts.append(torch.addcmul(local_t[j, 0], prod_t[j, 0], starts[-1]))
    starts_t = torch.stack(starts[::-1])  # [n_chunks, rows]
    next_start = torch.cat([starts_t[1:], torch.zeros_like(starts_t[:1])])  # 0 after the last chunk
    y = torch.addcmul(local_t, prod_t, next_start.unsqueeze(1))
    return y.view(n_chunks * chunk, rows)[:length].t().contiguous().reshape(shape)
