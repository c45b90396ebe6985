"""The training state: what a run has done so far, as one value that the trainer passes and gets back.

A :class:`TrainingState` is everything about a run's progress that is not a tensor: the step, the branch (rollbacks
so far), the actor's version (optimizer steps, so that the rollout engine knows when its weights are stale), the KL
controller's coefficient, the watchdog's own state (rules fired, the composed lr scale, the tightened grad clip) and
the recent metric rows the rules look back on. It is frozen: a step, a rollback, a resume or a watchdog action takes
one and returns a new one (:mod:`hpcppo.watchdog.respond`), so each of them can be tested without a model, a rank or a
file. The models, optimizers, lr schedules and data cursor are the trainer's; their state goes into checkpoints next
to :meth:`TrainingState.to_checkpoint`.

No torch here: the watchdog package stays importable on a login node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from hpcppo.watchdog.decide import WatchdogState

__all__ = ["TrainingState", "history_keep"]

Row = Mapping[str, float]


def history_keep(rules: Any) -> int:
    """How many recent rows the rules need: drop_frac looks back ``window`` finite values, and a few missing ones must
    not starve it (4 x the largest window, plus the row being judged)."""
    return 4 * max((r.window for r in rules if r.condition == "drop_frac"), default=1) + 1


@attrs.frozen(kw_only=True)
class TrainingState:
    """A run's progress after ``step`` steps (the models hold the weights of "after step ``step``")."""

    step: int = 0
    branch: int = 0  # rollbacks so far: part of the sampling seed, so a retried step draws new samples
    actor_version: int = 0  # the actor's optimizer steps (+1 per rollback): the engine re-syncs when it changes
    kl_coef: float  # the KL coefficient's one holder; the controller (algos.kl) maps it to the next step's
    watchdog: WatchdogState = attrs.field(factory=WatchdogState)
    history: tuple[dict[str, float], ...] = ()  # the current branch's recent rows, oldest first, each with "step"

    @property
    def lr_scale(self) -> float:
        """The product of every rollback's lr factor so far (rules and ``hpcppo rollback`` requests)."""
        return self.watchdog.lr_scale

    def grad_clip(self, configured: float) -> float:
        """The clip to use: the configured one, or the watchdog's tighter one once a rule has set it."""
        clip = self.watchdog.grad_clip
        return configured if clip is None else min(configured, clip)

    # ------------------------------------------------------------------ transitions
    def next_step(self) -> TrainingState:
        return attrs.evolve(self, step=self.step + 1)

    def actor_stepped(self) -> TrainingState:
        return attrs.evolve(self, actor_version=self.actor_version + 1)

    def with_kl_coef(self, kl_coef: float) -> TrainingState:
        return attrs.evolve(self, kl_coef=float(kl_coef))

    def with_row(self, row: Mapping[str, float], keep: int) -> TrainingState:
        """This step's metrics row added to the history (the newest ``keep`` rows are kept)."""
        added = {"step": float(self.step), **{k: float(v) for k, v in row.items()}}
        return attrs.evolve(self, history=(*self.history, added)[-keep:])

    def compose_lr_scale(self, factor: float) -> TrainingState:
        """Multiply the lr scale by ``factor`` (a rollback asked for outside the rules composes with theirs)."""
        return attrs.evolve(self, watchdog=attrs.evolve(self.watchdog, lr_scale=self.watchdog.lr_scale * float(factor)))

    def rolled_back(self, target: int, *, kl_coef: float, lr_factor: float | None = None) -> TrainingState:
        """Back at committed checkpoint ``target``: the step and the KL coefficient are the checkpoint's (``kl_coef``),
        the history forgets the abandoned branch's rows, the branch moves on (new samples), the engine must take the
        restored weights, and ``lr_factor`` (a request's) composes with the watchdog's lr scale. The watchdog's own
        state is kept, not restored: restoring it would forget the rollback itself (its count, its lr cut)."""
        state = self if lr_factor is None else self.compose_lr_scale(lr_factor)
        return attrs.evolve(state, step=target, branch=self.branch + 1, actor_version=self.actor_version + 1,
                            kl_coef=float(kl_coef), history=tuple(r for r in self.history if r["step"] <= target))

    # ------------------------------------------------------------------ checkpoint
    def to_checkpoint(self) -> dict[str, Any]:
        """The checkpoint's share of the state (plain types: loadable with ``torch.load(weights_only=True)``). The KL
        coefficient is saved as the controller's ``state_dict`` next to it, in the format that always had it."""
        return {"step": self.step, "branch": self.branch,
                "watchdog": {"state": self.watchdog.to_dict(), "history": [dict(r) for r in self.history]}}

    @classmethod
    def from_checkpoint(cls, extra: Mapping[str, Any], *, kl_coef: float, actor_version: int) -> TrainingState:
        """The state a checkpoint's ``extra`` recorded (checkpoints from before the watchdog kept state: its
        defaults). ``actor_version`` continues the resuming trainer's count, so the engine takes the loaded weights."""
        saved = extra.get("watchdog") or {}
        return cls(step=int(extra["step"]), branch=int(extra.get("branch", 0)), actor_version=actor_version,
                   kl_coef=float(kl_coef),
                   watchdog=WatchdogState.from_dict(saved["state"]) if saved else WatchdogState(),
                   history=tuple(dict(r) for r in saved.get("history", ())))
