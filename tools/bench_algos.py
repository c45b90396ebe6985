"""Time hpcppo.algos' GAE and PPO losses against straightforward per-token loops, in the same run.

    .venv/bin/python tools/bench_algos.py                    # 1024 x 1024, CPU, float32
    .venv/bin/python tools/bench_algos.py --device cuda --batch 4096

The "naive" references loop over the time dimension in torch with vectorised batch ops (verl's GAE is this loop);
each is checked against the library's result before it is timed, so a ratio never compares different numbers.
Prints one line per function: best-of-N seconds of the library, of the loop, the speed-up ratio, the largest
difference between the two results, and how many torch calls each makes (a load-independent proxy for kernel
launches, which bound these functions on a GPU).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

from hpcppo.algos import gae, masked_whiten, policy_loss, value_loss


def naive_gae(r: torch.Tensor, v: torch.Tensor, m: torch.Tensor, gamma: float, lam: float):
    """verl's reverse loop: one step per token, carrying value and advantage over masked-out tokens."""
    next_value = torch.zeros_like(v[:, 0])
    last = torch.zeros_like(v[:, 0])
    out = []
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        current = delta + gamma * lam * last
        next_value = v[:, t] * m[:, t] + (1 - m[:, t]) * next_value
        last = current * m[:, t] + (1 - m[:, t]) * last
        out.append(last)
    raw = torch.stack(out[::-1], dim=1)
    return masked_whiten(raw, m), raw + v


def naive_policy_loss(old, new, adv, m, clip: float, c: float):
    """Token-mean PPO loss accumulated column by column (``unbind`` once: a slice per step would make autograd
    materialise a full-size gradient per token)."""
    total = torch.zeros((), dtype=new.dtype, device=new.device)
    for o, n, a, mt in zip(old.unbind(1), new.unbind(1), adv.unbind(1), m.unbind(1)):
        ratio = torch.exp(torch.clamp(n - o, -20.0, 20.0))
        l1 = -a * ratio
        l2 = -a * torch.clamp(ratio, 1 - clip, 1 + clip)
        lc = torch.maximum(l1, l2)
        loss_t = torch.where(a < 0, torch.minimum(lc, -a * c), lc)
        total = total + (loss_t * mt).sum()
    return total / m.sum()


def naive_value_loss(v, v_old, ret, m, eps: float):
    """Token-mean clipped value loss accumulated column by column."""
    total = torch.zeros((), dtype=v.dtype, device=v.device)
    for vt, ot, rt, mt in zip(v.unbind(1), v_old.unbind(1), ret.unbind(1), m.unbind(1)):
        clipped = torch.maximum(torch.minimum(vt, ot + eps), ot - eps)
        loss_t = torch.maximum((vt - rt) ** 2, (clipped - rt) ** 2)
        total = total + (loss_t * mt).sum()
    return 0.5 * total / m.sum()


class _CountCalls(TorchFunctionMode):
    """Counts torch calls made from Python: a load-independent proxy for kernel launches (forward only)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def count_calls(fn: Callable[[], object]) -> int:
    with _CountCalls() as counter:
        fn()
    return counter.calls


def timed(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Best wall time of ``fn`` over ``repeats`` runs after one warm-up (the minimum: least disturbed by other
    processes on a shared machine)."""
    fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return min(samples)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(args.seed)
    b, t = args.batch, args.length

    def rand(scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(b, t, generator=g) * scale).to(device)

    # EOS-style masks with a multi-turn gap in every fourth row.
    lengths = torch.randint(t // 4, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    mask[::4, t // 8 : t // 8 + 16] = 0
    mask = mask.to(device)
    r, v, v_old, ret = rand(0.1), rand(), rand(), rand()
    old, adv = rand() - 3, rand()
    new = (old + 0.2 * rand()).requires_grad_()
    values = v.clone().requires_grad_()

    checks = {
        "gae": (lambda: gae(r, v, mask, 0.99, 0.95), lambda: naive_gae(r, v, mask, 0.99, 0.95)),
        "policy_loss fwd+bwd": (
            lambda: policy_loss(old, new, adv, mask, 0.2)["loss"],
            lambda: naive_policy_loss(old, new, adv, mask, 0.2, 3.0),
        ),
        "value_loss fwd+bwd": (
            lambda: value_loss(values, v_old, ret, mask, 0.5)["loss"],
            lambda: naive_value_loss(values, v_old, ret, mask, 0.5),
        ),
    }
    print(f"batch {b} x {t}, device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(
        f"{'function':22s} {'hpcppo s':>10s} {'loop s':>10s} {'speed-up':>9s} {'max |diff|':>11s}"
        f" {'torch calls (fwd)':>18s}"
    )
    for name, (fast, slow) in checks.items():
        a, ref = fast(), slow()
        pairs = zip(a, ref) if isinstance(a, tuple) else [(a, ref)]
        diff = max(float((x.detach() - y.detach()).abs().max()) for x, y in pairs)

        def with_backward(fn: Callable[[], object]) -> Callable[[], object]:
            if not name.endswith("bwd"):
                return fn
            leaf = new if name.startswith("policy") else values
            return lambda: torch.autograd.grad(fn(), leaf)  # type: ignore[arg-type]

        t_fast = timed(with_backward(fast), args.repeats, device)
        t_slow = timed(with_backward(slow), max(1, args.repeats // 2), device)
        calls = f"{count_calls(fast)} vs {count_calls(slow)}"
        print(f"{name:22s} {t_fast:10.4f} {t_slow:10.4f} {t_slow / t_fast:8.1f}x {diff:11.2e} {calls:>18s}")


if __name__ == "__main__":
    main()
