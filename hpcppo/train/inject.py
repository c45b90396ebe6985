"""Faults injected on purpose (``[debug.inject]``, see :mod:`hpcppo.config.debug` for the semantics of each).

Injection lives at two points of the step: :meth:`FaultInjector.before_step` (faults in the job itself: a NaN critic,
a hang, a killed rank) and :meth:`FaultInjector.on_row` (faults in what the watchdog reads: a KL spike, a reward
collapse). Every injection is logged, so a run's log never hides that its fault was staged.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from typing import Any

import torch
from torch import nn

log = logging.getLogger("hpcppo.train")


class FaultInjector:
    def __init__(self, inject: Any, *, rank: int, attempt: int):
        self.cfg = inject
        self.rank = rank
        self.attempt = attempt

    def before_step(self, step: int, branch: int, critic: nn.Module | None) -> None:
        cfg = self.cfg
        in_attempt = self.attempt == cfg.attempt
        if in_attempt and step == cfg.kill_rank_at_step and self.rank == cfg.kill_rank:
            self._announce(f"rank {self.rank} kills itself at step {step} (attempt {self.attempt})")
            os.kill(os.getpid(), signal.SIGKILL)
        if in_attempt and step == cfg.hang_at_step and self.rank == cfg.hang_rank:
            self._announce(f"rank {self.rank} hangs at step {step} (attempt {self.attempt})")
            while True:  # a hang: only a signal or the watchdog process ends it
                time.sleep(3600)
        if branch == 0 and step == cfg.nan_value_loss_at_step and critic is not None:
            log.warning("debug.inject: the critic's weights become NaN at step %d", step)
            with torch.no_grad():
                for p in critic.parameters():
                    local = p.to_local() if hasattr(p, "to_local") else p  # FSDP2 shards: each rank its own
                    local.fill_(math.nan)

    @staticmethod
    def _announce(what: str) -> None:
        """Log the fault and flush: the process is about to die or stop, and its log must say why."""
        log.warning("debug.inject: %s", what)
        for handler in logging.getLogger().handlers:
            handler.flush()

    def on_row(self, step: int, branch: int, row: dict[str, float]) -> dict[str, float]:
        """The row the watchdog judges and the log keeps, with this step's staged values."""
        cfg = self.cfg
        if branch != 0:
            return row
        out = dict(row)
        if step == cfg.kl_spike_at_step and "kl/actor_ref" in out:
            log.warning("debug.inject: kl/actor_ref %.4g reported as %.4g at step %d", out["kl/actor_ref"],
                        cfg.kl_spike_value, step)
            out["kl/actor_ref"] = cfg.kl_spike_value
        if cfg.reward_collapse_at_step and step >= cfg.reward_collapse_at_step and "reward/mean" in out:
            log.warning("debug.inject: reward/mean %.4g reported x%.3g at step %d", out["reward/mean"],
                        cfg.reward_collapse_factor, step)
            out["reward/mean"] = out["reward/mean"] * cfg.reward_collapse_factor
        return out
