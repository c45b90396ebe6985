"""verl's DAPO reward manager on top of a rule-based score: the overlong buffer's soft length penalty.

verl b178a3c, verl/workers/reward_manager/dapo.py, ``DAPORewardManager.__call__`` (and the reward loop's copy,
verl/experimental/reward_loop/reward_manager/dapo.py, ``run_single``): for a response of ``L`` valid tokens (the
response's attention mask, EOS included) ::

    expected_len    = max_resp_len - overlong_buffer.len
    exceed_len      = L - expected_len
    overlong_reward = min(-exceed_len / overlong_buffer.len * penalty_factor, 0)
    reward          = score + overlong_reward

placed on the response's last token like any score. With ``overlong_buffer.log`` verl records ``overlong_reward``
and ``overlong`` (``overlong_reward < 0``) per response. The rest of the DAPO manager is the naive one hpcppo
already follows: it decodes the response with ``skip_special_tokens=True`` (then drops a trailing EOS string, which
that decoding has already removed) and calls the same ``compute_score``; its ``acc`` extra info is the score
before the penalty.

No torch here: the formula is pure, and login-node code may import this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["OverlongBuffer", "overlong_reward", "apply_overlong"]


@dataclass(frozen=True)
class OverlongBuffer:
    """DAPO's overlong buffer (verl's ``overlong_buffer_cfg`` and ``max_resp_len``)."""

    max_resp_len: int
    buffer_len: int
    penalty_factor: float

    def __post_init__(self) -> None:
        if self.buffer_len < 1 or self.max_resp_len < self.buffer_len:
            raise ValueError(f"overlong buffer of {self.buffer_len} tokens with max_resp_len {self.max_resp_len}: "
                             f"need 1 <= len <= max_resp_len")


def overlong_reward(length: int, buffer: OverlongBuffer) -> float:
    """The penalty (<= 0) of a response of ``length`` valid tokens."""
    exceed_len = length - (buffer.max_resp_len - buffer.buffer_len)
    return min(-exceed_len / buffer.buffer_len * buffer.penalty_factor, 0.0)


def apply_overlong(scores: Sequence[float], lengths: Sequence[int],
                   buffer: OverlongBuffer) -> tuple[list[float], list[float]]:
    """``(rewards, penalties)``: each score plus its response's :func:`overlong_reward`, and the penalties."""
    if len(scores) != len(lengths):
        raise ValueError(f"{len(scores)} scores but {len(lengths)} response lengths")
    penalties = [overlong_reward(int(n), buffer) for n in lengths]
    return [float(s) + p for s, p in zip(scores, penalties)], penalties
