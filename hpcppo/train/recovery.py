"""The trainer's hands: checkpoints, resume, rollback, critic restart and stopping, on the models of one rank.

:class:`Recovery` is what the trainer lends the watchdog (:class:`hpcppo.watchdog.Hands`) and what serves
``hpcppo rollback`` requests. It touches the models, optimizers, lr schedules, KL controller, data cursor and the
checkpoint manager it is given, and nothing else; the run's progress comes in and goes out as a
:class:`~hpcppo.watchdog.TrainingState`. Every rank calls it alike (rank 0's decision and request list are broadcast
first), so the collectives inside checkpoint loads and saves line up.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import attrs
from torch.distributed.checkpoint.api import CheckpointException

from hpcppo.distributed.checkpoint import NoIntactCheckpointError
from hpcppo.distributed.env import broadcast_object
from hpcppo.rundir import checkpoints as layout
from hpcppo.rundir import control, events, exitcodes
from hpcppo.train.optim import offload_optimizer_state
from hpcppo.watchdog import TrainingState
from hpcppo.watchdog.audit import Audit

if TYPE_CHECKING:
    from hpcppo.rollout.source import RolloutSource
    from hpcppo.train.build import Components

log = logging.getLogger("hpcppo.train")


class Recovery:
    """Checkpoint, resume, roll back, restart the critic, stop: for one rank's :class:`Components`."""

    def __init__(self, c: Components, audit: Audit, source: RolloutSource):
        self.c = c
        self.audit = audit
        self.source = source  # its state goes into checkpoints (a split run's queue)
        # Duration of the checkpoint written after the previous row; recorded as time/checkpoint_s in the next.
        self.last_checkpoint_s: float | None = None

    # ------------------------------------------------------------------ the Hands protocol
    def committed(self) -> list[int]:
        return self.c.ckpt.list_committed()

    def record(self, step: int, kind: str, message: str, **details: Any) -> None:
        self.audit.record(step, kind, message, **details)

    def roll_back(self, state: TrainingState, target: int, *, lr_factor: float | None = None) -> TrainingState:
        """Back to committed checkpoint ``target``: models, optimizers, lr schedules and KL coefficient as they were
        there; the data cursor stays where it is (the batches since ``target`` are skipped), the sampling seed moves
        to a new branch, the learning rates take the composed scale. The checkpoint is then saved again with that
        state, so a crash from here on resumes the new branch, not the abandoned one."""
        c = self.c
        start = time.perf_counter()
        cursor = c.sampler.state_dict()
        c.ckpt.abandon_after(target)
        models, optims = self.checkpointed()
        extra = c.ckpt.load(target, models=models, optimizers=optims)
        kl_coef = c.kl_ctrl.coef_from_state(extra["kl_ctrl"])  # checks the controller's kind
        state = state.rolled_back(target, kl_coef=kl_coef, lr_factor=lr_factor)
        self.restore_schedules(extra, state.lr_scale)
        c.sampler.load_state_dict(cursor)
        self.reoffload_optimizers()
        self.save(state)
        log.info("rolled back to step %d (branch %d, lr x%g in all) in %.2f s, the re-saved checkpoint included", target,
                 state.branch, state.lr_scale, time.perf_counter() - start)
        return state

    def restart_critic(self, target: int) -> None:
        """The critic's weights and optimizer state from committed checkpoint ``target``; the actor is untouched."""
        c = self.c
        critic = c.critic_set()
        c.ckpt.load(target, models={"critic": critic.model}, optimizers={"critic": critic.optim}, restore_rng=False)
        if critic.optim_offload:
            offload_optimizer_state(critic.optim)

    def stop(self, state: TrainingState, kind: str, reason: str, *, event: str | None = None,
             save: bool = True) -> int:
        """Checkpoint (unless ``save`` is false or step 0, the initial state) and stop: ``pause`` waits for ``hpcppo
        resume`` (no requeue; ``control/PAUSED`` tells ``hpcppo status`` why), ``requeue`` asks the scheduler for one.
        ``event`` is the HDF5 event's kind (``paused`` / ``requeue`` by default)."""
        c = self.c
        if save and state.step > 0 and c.ckpt.latest_committed() != state.step:
            self.save(state)
        if c.metrics is not None:
            kind_logged = event or (events.PAUSED if kind == "pause" else events.REQUEUE)
            c.metrics.log_event(state.step, kind_logged, reason[:1000])
        if kind == "pause" and c.env.rank == 0:
            control.record_paused(c.run_dir, state.step, reason)
        log.info("%s after step %d: %s, exiting", kind, state.step, reason)
        return exitcodes.PAUSED if kind == "pause" else exitcodes.REQUEUE

    # ------------------------------------------------------------------ rollback requests (hpcppo rollback)
    def serve_requests(self, state: TrainingState, requests: list[Any]) -> TrainingState:
        """Apply rank 0's rollback requests in arrival order (collective: rank 0 broadcasts what to do)."""
        c = self.c
        plan = []
        if c.env.rank == 0:
            for req in requests:
                committed = [s for s in self.committed() if req.to_step is None or s <= req.to_step]
                plan.append((req, committed[-1] if committed else None))
        for req, target in broadcast_object(plan):
            outcome: dict[str, Any]
            if target is None:
                outcome = {"status": "rejected", "reason": f"no committed checkpoint at or before step {req.to_step}; "
                                                           f"committed: {self.committed() or 'none'}"}
                self.audit.record(state.step, events.CONTROL_REJECTED, f"rollback request {req.id}: "
                                  f"{outcome['reason']}", source="control", request=req.id)
            else:
                factor = control.DEFAULT_LR_SCALE if req.lr_scale is None else req.lr_scale
                self.audit.record(state.step, events.CONTROL_ROLLBACK, f"rollback request {req.id}: back to "
                                  f"checkpoint step {target}, lr x{factor:g}", source="control", request=req.id,
                                  checkpoint=target, lr_scale=factor)
                state = self.roll_back(state, target, lr_factor=factor)
                outcome = {"status": "applied", "checkpoint": target, "step": state.step}
            if c.env.rank == 0:
                control.acknowledge(c.run_dir, req, outcome)
        return state

    # ------------------------------------------------------------------ checkpoints
    def checkpointed(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The trained models and their optimizers, by checkpoint name."""
        trained = self.c.trained()
        return ({name: s.model for name, s in trained.items()}, {name: s.optim for name, s in trained.items()})

    def checkpoint_extra(self, state: TrainingState) -> dict[str, Any]:
        c = self.c
        extra = state.to_checkpoint() | {"sampler": c.sampler.state_dict(),
                                         "kl_ctrl": c.kl_ctrl.state_dict(state.kl_coef),
                                         "rollout_source": self.source.state_dict(state.step, state.branch,
                                                                                  state.actor_version)}
        return extra | {f"{name}_lr": s.lr.state_dict() for name, s in c.trained().items()}

    def save(self, state: TrainingState, background: bool = False) -> None:
        """Checkpoint ``state.step``; ``background``: wait only for the staging, the write overlaps the next step
        (committed when ``c.ckpt`` next waits: the next save, a query of the committed steps, the end of training)."""
        c = self.c
        models, optims = self.checkpointed()
        start = time.perf_counter()
        with self.checkpoint_failures(state.step):
            c.ckpt.save(state.step, models=models, optimizers=optims, extra=self.checkpoint_extra(state),
                        background=background)
        self.last_checkpoint_s = time.perf_counter() - start
        if c.metrics is not None:
            c.metrics.fsync()

    @contextlib.contextmanager
    def checkpoint_failures(self, step: int) -> Iterator[None]:
        """A failed save (this one, or a background one that the block waited for) as one line naming its step."""
        c = self.c
        try:
            yield
        # Every rank fails a save together (DCP and the checkpoint agree on failures). DCP's CheckpointException
        # derives from BaseException (torch/distributed/checkpoint/api.py), so `except Exception` misses it.
        except (Exception, CheckpointException) as exc:
            # A background save's failure is raised by the next save or wait: name the step that failed.
            failed = step if c.ckpt.failed_step is None else c.ckpt.failed_step
            raise layout.failed_save(c.ckpt.root, failed, exc, remove=c.env.rank == 0) from exc

    def settle(self, step: int) -> None:
        """Let a background save in flight commit before a clean exit (every rank is at the same point, so its
        collectives can finish); after an error nobody waits for peers that may be gone."""
        with self.checkpoint_failures(step):
            self.c.ckpt.wait()

    def restore_schedules(self, extra: dict[str, Any], lr_scale: float) -> None:
        """The lr schedules from a checkpoint's ``extra``, scaled by the watchdog's composed ``lr_scale``."""
        trained = self.c.trained()
        for name, s in trained.items():
            s.lr.load_state_dict(extra[f"{name}_lr"])
        for s in trained.values():
            s.lr.set_scale(lr_scale)

    def reoffload_optimizers(self) -> None:
        """Loaded optimizer state sits on the parameters' devices; with optimizer_offload it waits on the host."""
        for name, s in self.c.trained().items():
            if s.optim_offload:
                moved = offload_optimizer_state(s.optim)
                log.info("%s optimizer state offloaded to host memory (%.2f MiB on this rank)", name, moved / 2**20)

    def resume(self, state: TrainingState) -> TrainingState:
        """Continue from the newest intact committed checkpoint (``checkpoint.resume = "auto"``); ``state`` unchanged
        when there is none.

        Each candidate is checked against the sizes and checksums its commit recorded before it is trusted. A damaged
        one falls back to the previous committed checkpoint; it is set aside (``step-<N>.corrupt-<hex>``, kept) and
        recorded as a ``checkpoint.corrupt`` event naming the file. When every checkpoint is damaged the run fails
        with one line and moves nothing, rather than start again at step 0 and lose its progress unnoticed.
        """
        c = self.c
        if c.ckpt.latest_committed() is None or c.cfg.checkpoint.resume == "never":
            return state
        models, optims = self.checkpointed()
        try:
            resumed = c.ckpt.load_newest_intact(models=models, optimizers=optims)
        except NoIntactCheckpointError as exc:
            for bad in exc.damaged:
                self.audit.record(bad.step or 0, events.CHECKPOINT_CORRUPT, f"{bad}; no intact checkpoint is left",
                                  source="trainer", file=str(bad.path / bad.file), checkpoint=bad.step)
            raise
        if resumed is None:  # pragma: no cover - the checkpoints vanished since latest_committed()
            return state
        latest, extra = resumed.step, resumed.extra
        for bad in resumed.damaged:
            moved = bad.set_aside_as.name if bad.set_aside_as is not None else "?"
            self.audit.record(bad.step or 0, events.CHECKPOINT_CORRUPT, f"{bad}; set aside as {moved}, "
                              f"resuming from checkpoint step {latest}", source="trainer",
                              file=str(bad.path / bad.file), checkpoint=bad.step, fallback=latest,
                              set_aside_as=str(bad.set_aside_as))
        state = TrainingState.from_checkpoint(extra, kl_coef=c.kl_ctrl.coef_from_state(extra["kl_ctrl"]),
                                              actor_version=state.actor_version + 1)
        if state.watchdog.paused_by is not None:  # the run stopped on a rule's pause, and a person resumed it
            rule = state.watchdog.paused_by
            state = attrs.evolve(state, watchdog=state.watchdog.rearmed())
            self.audit.record(state.step, events.watchdog_kind(events.REARMED), f"{rule}: re-armed on resume after "
                              f"the pause it asked for ({state.watchdog.fired.get(rule, 0)} firing(s) counted)",
                              rule=rule)
        self.restore_schedules(extra, state.lr_scale)
        c.sampler.load_state_dict(extra["sampler"])
        self.source.load_state_dict(extra.get("rollout_source", {}))  # absent from checkpoints before issue 35
        self.reoffload_optimizers()
        if c.metrics is not None:
            c.metrics.log_event(state.step, events.RESUME, f"resumed from checkpoint step {latest}")
        log.info("resumed from checkpoint step %d", latest)
        return state
