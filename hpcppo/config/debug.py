"""``[debug]`` and ``[debug.inject]``: faults injected on purpose, to prove that the watchdog and the recovery
paths work on this run's own machinery (a rehearsal on the local default or the dev cluster before a long run).

Each fault is off at step 0. Faults that the watchdog repairs inside the job (a NaN critic, a KL spike, a reward
collapse) happen on the first pass over their step only: after a rollback the retried steps are clean, like a
transient fault or a bad batch that a rollback skips. The branch counter that decides this is in every checkpoint,
so a killed and resumed run injects exactly what a straight run does. Faults that take the job down (a hang, a
killed rank) happen only in attempt ``attempt``, so the attempt that recovers from them runs clean.
"""

from __future__ import annotations

import attrs

from hpcppo.config.fields import opt

__all__ = ["DebugSection", "InjectSection"]


@attrs.frozen(kw_only=True)
class InjectSection:
    """``[debug.inject]``: faults to inject (0 = off)."""

    nan_value_loss_at_step: int = opt(0, ge=0, help="At the start of this step the critic's weights become NaN, so "
                                                  "critic/vf_loss is NaN (the value_loss_nonfinite rule restarts the critic).")
    kl_spike_at_step: int = opt(0, ge=0, help="This step's kl/actor_ref row value is replaced by kl_spike_value "
                                            "(the models are untouched: it exercises the rules, not the model).")
    kl_spike_value: float = opt(0.08, gt=0.0, help="The KL reported at kl_spike_at_step.")
    reward_collapse_at_step: int = opt(0, ge=0, help="From this step until a rollback, reward/mean is reported "
                                                   "multiplied by reward_collapse_factor (the models are untouched).")
    reward_collapse_factor: float = opt(0.2, ge=0.0, lt=1.0, help="Multiplier of reward/mean during the collapse.")
    hang_at_step: int = opt(0, ge=0, help="Rank hang_rank stops making progress at the start of this step "
                                        "(the watchdog process beside the trainer detects it).")
    hang_rank: int = opt(0, ge=0, help="The rank that hangs.")
    kill_rank_at_step: int = opt(0, ge=0, help="Rank kill_rank kills itself with SIGKILL at the start of this step.")
    kill_rank: int = opt(0, ge=0, help="The rank that is killed (kill_rank_at_step, kill_in_checkpoint_at_step).")
    kill_in_checkpoint_at_step: int = opt(0, ge=0, help="Rank kill_rank kills itself with SIGKILL in the middle of "
                                                      "writing this step's checkpoint: after its shard and files "
                                                      "are on disk, before the checkpoint is committed.")
    kill_in_metrics_row_at_step: int = opt(0, ge=0, help="Rank 0 (the metrics writer) kills itself with SIGKILL "
                                                       "in the middle of appending this step's row: the row's "
                                                       "values are flushed to the HDF5 file, its commit mark "
                                                       "(seq) is not.")
    attempt: int = opt(0, ge=0, help="The attempt in which hang and kill faults happen, numbered as the metrics "
                                     "files (0 = the first); the others run clean.")

    @property
    def any(self) -> bool:
        return any((self.nan_value_loss_at_step, self.kl_spike_at_step, self.reward_collapse_at_step,
                    self.hang_at_step, self.kill_rank_at_step, self.kill_in_checkpoint_at_step,
                    self.kill_in_metrics_row_at_step))


@attrs.frozen(kw_only=True)
class DebugSection:
    """``[debug]``: tools for rehearsing failures."""

    inject: InjectSection = opt(factory=InjectSection, help="Faults to inject on purpose.")
