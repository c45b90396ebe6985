"""What the trainer does when the watchdog or a person asks for it: the actions of a rules decision (rollback,
critic restart, stronger KL penalty, tighter clip, pause, requeue) and rollback requests from ``hpcppo rollback``.

:class:`Recovery` is mixed into :class:`hpcppo.train.trainer.Trainer`: the methods act on the trainer's models,
schedules and checkpoints. Every rank calls them alike (rank 0's decision and request list are broadcast first).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from hpcppo.distributed.env import broadcast_object
from hpcppo.rundir import control, events, exitcodes
from hpcppo.train.optim import offload_optimizer_state
from hpcppo.train.watch import describe
from hpcppo.watchdog import Decision, raised_kl_coef

if TYPE_CHECKING:
    from hpcppo.train.build import Components
    from hpcppo.train.watch import RuleKeeper

log = logging.getLogger("hpcppo.train")
_SUPPRESSED = events.watchdog_kind(events.SUPPRESSED)


class Recovery:
    """The trainer's recovery actions (a mixin of :class:`~hpcppo.train.trainer.Trainer`)."""

    c: Components
    rules: RuleKeeper
    step: int
    branch: int
    actor_version: int

    def obey(self, decision: Decision) -> int | None:
        """Apply the rules' decision on this step (every rank alike); an exit code when the run must stop."""
        c, rules = self.c, self.rules
        judged = self.step  # a rollback moves self.step back; every event is dated by the step judged
        for action in decision.suppressed:
            winner = decision.superseded_by(action)
            rules.record(judged, _SUPPRESSED, f"{action.rule}: {action.reason} (superseded by "
                         f"{winner.kind if winner else '?'})", **describe(action))
        for i, action in enumerate(decision.actions):
            detail = describe(action)
            if action.kind in ("pause", "requeue"):
                rules.record(judged, events.watchdog_kind(action.kind), f"{action.rule}: {action.reason}", **detail)
                return self.stop(action.kind, f"watchdog rule {action.rule}: {action.reason}")
            if action.kind in ("rollback", "restart_critic"):
                target = rules.target_before_anomaly(action, c.ckpt.list_committed())
                if target is None:
                    reason = (f"watchdog rule {action.rule} ({action.reason}) asked for {action.kind} but no committed "
                              f"checkpoint predates the anomaly; committed: {c.ckpt.list_committed() or 'none'}")
                    rules.record(judged, events.watchdog_kind("pause"), reason, **detail)
                    if action.kind == "rollback":
                        rules.compose_lr_scale(1.0 / action.lr_scale)  # no rollback happened: no lr cut either
                    for rest in decision.actions[i + 1:]:
                        rules.record(judged, _SUPPRESSED, f"{rest.rule}: {rest.reason} (superseded by the "
                                     f"pause)", **describe(rest))
                    return self.stop("pause", reason)
                rules.record(judged, events.watchdog_kind(action.kind), f"{action.rule}: {action.reason}; back to "
                             f"checkpoint step {target}", checkpoint=target, **detail)
                if action.kind == "rollback":
                    self.roll_back(target)
                else:
                    self.restart_critic(target)
            elif action.kind == "raise_kl_coef":
                old = c.kl_ctrl.value
                c.kl_ctrl.value = raised_kl_coef(old, action)
                rules.state = rules.state.with_kl_coef(c.kl_ctrl.value)
                rules.record(judged, events.watchdog_kind(action.kind), f"{action.rule}: {action.reason}; kl_coef "
                             f"{old:.4g} -> {c.kl_ctrl.value:.4g}", old=old, new=c.kl_ctrl.value, **detail)
            elif action.kind == "set_grad_clip":
                rules.record(judged, events.watchdog_kind(action.kind), f"{action.rule}: {action.reason}; grad clip "
                             f"{rules.grad_clip(self.cfg.actor.grad_clip):.4g} (actor), "
                             f"{rules.grad_clip(self.cfg.critic.grad_clip):.4g} (critic)", **detail)
        return None

    def roll_back(self, target: int, *, lr_factor: float | None = None) -> None:
        """Back to committed checkpoint ``target``: models, optimizers, lr schedules and KL controller as they were
        there; the data cursor stays where it is (the batches since ``target`` are skipped), the sampling seed moves
        to a new branch, the learning rates take the composed scale. The checkpoint is then saved again with that
        state, so a crash from here on resumes the new branch, not the abandoned one."""
        c = self.c
        start = time.perf_counter()
        if lr_factor is not None:
            self.rules.compose_lr_scale(lr_factor)
        cursor = c.sampler.state_dict()
        c.ckpt.abandon_after(target)
        models, optims = self.checkpointed()
        extra = c.ckpt.load(target, models=models, optimizers=optims)
        self.restore_schedules(extra)
        c.sampler.load_state_dict(cursor)
        self.branch += 1
        self.step = target
        self.rules.rolled_back_to(target)
        self.actor_version += 1  # the engine must take the restored weights
        self.reoffload_optimizers()
        self.save_checkpoint()
        log.info("rolled back to step %d (branch %d, lr x%g in all) in %.2f s, the re-saved checkpoint included", target,
                 self.branch, self.rules.state.lr_scale, time.perf_counter() - start)

    def restart_critic(self, target: int) -> None:
        """The critic's weights and optimizer state from committed checkpoint ``target``; the actor is untouched."""
        c = self.c
        c.ckpt.load(target, models={"critic": c.critic}, optimizers={"critic": c.critic_optim}, restore_rng=False)
        if c.critic_optim_offload:
            offload_optimizer_state(c.critic_optim)

    def stop(self, kind: str, reason: str, *, event: str | None = None, save: bool = True) -> int:
        """Checkpoint (unless ``save`` is false or step 0, the initial state) and stop: ``pause`` waits for ``hpcppo
        resume`` (no requeue; ``control/PAUSED`` tells ``hpcppo status`` why), ``requeue`` asks the scheduler for one.
        ``event`` is the HDF5 event's kind (``paused`` / ``requeue`` by default)."""
        c = self.c
        if save and self.step > 0 and c.ckpt.latest_committed() != self.step:
            self.save_checkpoint()
        if c.metrics is not None:
            kind_logged = event or (events.PAUSED if kind == "pause" else events.REQUEUE)
            c.metrics.log_event(self.step, kind_logged, reason[:1000])
        if kind == "pause" and self.env.rank == 0:
            control.record_paused(c.run_dir, self.step, reason)
        log.info("%s after step %d: %s, exiting", kind, self.step, reason)
        return exitcodes.PAUSED if kind == "pause" else exitcodes.REQUEUE

    def serve_requests(self, requests: list[Any]) -> None:
        """Apply rank 0's rollback requests in arrival order (collective: rank 0 broadcasts what to do)."""
        c = self.c
        plan = []
        if self.env.rank == 0:
            for req in requests:
                committed = [s for s in c.ckpt.list_committed() if req.to_step is None or s <= req.to_step]
                plan.append((req, committed[-1] if committed else None))
        for req, target in broadcast_object(plan):
            if target is None:
                outcome = {"status": "rejected", "reason": f"no committed checkpoint at or before step {req.to_step}; "
                                                           f"committed: {c.ckpt.list_committed() or 'none'}"}
                self.rules.record(self.step, events.CONTROL_REJECTED, f"rollback request {req.id}: {outcome['reason']}",
                                  source="control", request=req.id)
            else:
                factor = control.DEFAULT_LR_SCALE if req.lr_scale is None else req.lr_scale
                self.rules.record(self.step, events.CONTROL_ROLLBACK, f"rollback request {req.id}: back to checkpoint "
                                  f"step {target}, lr x{factor:g}", source="control", request=req.id, checkpoint=target,
                                  lr_scale=factor)
                self.roll_back(target, lr_factor=factor)
                outcome = {"status": "applied", "checkpoint": target, "step": self.step}
            if self.env.rank == 0:
                control.acknowledge(c.run_dir, req, outcome)
