"""Faults injected on purpose (``[debug.inject]``, see :mod:`hpcppo.config.debug` for the semantics of each).

Injection lives at two points of the step: :meth:`FaultInjector.before_step` (faults in the job itself: a NaN critic,
a hang, a killed rank, and the arming of the two kills below) and :meth:`FaultInjector.on_row` (faults in what the
watchdog reads: a KL spike, a reward collapse). Every injection is logged, so a run's log never hides that its fault
was staged.

Two kills happen inside I/O that the trainer does not step through itself, so the injector wraps one object of this
rank for the step that is armed, and nothing else: the checkpoint manager's writing of this rank's own files (the
kill comes after the rank's DCP shard and files are on disk and before the commit) and the metrics writer's ``seq``
dataset (the row's other columns are written and flushed first, as a kill between two resizes would leave them).
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
    def __init__(self, inject: Any, *, rank: int, attempt: int, ckpt: Any = None, metrics: Any = None):
        self.cfg = inject
        self.rank = rank
        self.attempt = attempt
        self.ckpt = ckpt  # hpcppo.distributed.checkpoint.CheckpointManager (kill_in_checkpoint_at_step)
        self.metrics = metrics  # rank 0's hpcppo.metrics.MetricsWriter (kill_in_metrics_row_at_step)

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
        if in_attempt and step == cfg.kill_in_checkpoint_at_step and self.rank == cfg.kill_rank:
            self._arm_checkpoint_kill(step)
        if in_attempt and step == cfg.kill_in_metrics_row_at_step and self.metrics is not None:
            self._arm_metrics_kill(step)
        if branch == 0 and step == cfg.nan_value_loss_at_step and critic is not None:
            log.warning("debug.inject: the critic's weights become NaN at step %d", step)
            with torch.no_grad():
                for p in critic.parameters():
                    local = p.to_local() if hasattr(p, "to_local") else p  # FSDP2 shards: each rank its own
                    local.fill_(math.nan)

    def _arm_checkpoint_kill(self, step: int) -> None:
        """The next save on this rank dies once its own files are written (the shard is already on disk)."""
        write_own_files = self.ckpt._write_own_files

        def write_then_die(tmp: Any, *args: Any, **kwargs: Any) -> Any:
            files = write_own_files(tmp, *args, **kwargs)
            self._announce(f"rank {self.rank} kills itself while writing checkpoint {tmp} (step {step}, "
                           f"attempt {self.attempt}): its files are on disk, the checkpoint is not committed")
            os.kill(os.getpid(), signal.SIGKILL)
            return files

        self.ckpt._write_own_files = write_then_die

    def _arm_metrics_kill(self, step: int) -> None:
        """The writer dies while appending this step's row: every column but ``seq`` (the commit mark, written
        last) holds the row and is flushed to the file; ``seq`` is resized and still reads as its fill value."""
        writer = self.metrics
        seq = writer._ds["seq"]
        announce = self._announce

        class _DieBeforeSeq:
            def resize(self, *args: Any, **kwargs: Any) -> None:
                seq.resize(*args, **kwargs)

            def __setitem__(self, key: Any, value: Any) -> None:
                writer._file.flush()
                announce(f"rank 0 kills itself while appending the metrics row of step {step} (its values are "
                         f"flushed, its seq is not written)")
                os.kill(os.getpid(), signal.SIGKILL)

        writer._ds["seq"] = _DieBeforeSeq()

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
