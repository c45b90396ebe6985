"""A rollout rank's loop in split placement (the protocol: :mod:`hpcppo.rollout.split`).

Take the notices in the order they were sent, and apply each one only when this rank's next unit needs it: a unit
of step ``t`` is generated with the weights the trainer held at step ``t - max_staleness`` (the reset's step when
that is later: :func:`~hpcppo.rollout.split.generation_step`), never older and never newer, so which weights made
which sample does not depend on how fast either side runs. A reset, a redo or the stop takes effect at once (with
every notice before it). Then generate the next unit of this rank, send it, repeat; with nothing to do, wait for the
next notice. The prompts of a step come from a copy of the trainer's sampler (the same permutation of the same data
set), its seed from the step, the trainer rank and the branch: a rollout rank generates what a colocated rank would,
and nothing but cursors crosses the bridge.

An engine with tensor parallelism (``rollout.tensor_parallel_size = k``) is a group of k rollout ranks
(:func:`~hpcppo.rollout.split.engine_of`) that must run every collective in the same order: the same weight loads,
the same generate calls with the same prompts and seed. The group's first rank (its *leader*) is the only one that
reads notices and sends units; before each weight load, unit and stop it tells the others what to do through the
engine's own group (:class:`EngineGroup`), and they do the same (:meth:`RolloutWorker.follow`). Units are dealt
over engines, not ranks.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from hpcppo.rollout.agent_loop import AgentLoop
from hpcppo.rollout.base import RolloutEngine, SamplingParams, derive_seed
from hpcppo.rollout.source import Generated, generate
from hpcppo.rollout.split import Notice, Produced, RolloutEnd, Validate, Validated, generation_step, owner

log = logging.getLogger("hpcppo.rollout")

class Sampler(Protocol):
    """The trainer's prompt sampler (``hpcppo.data.sampler.ShardedEpochSampler``), one data-parallel rank."""

    dp_size: int

    def next_batch(self) -> list[int]: ...

    def load_state_dict(self, state: Any) -> None: ...


NOTICE_POLL_S = 0.005  # the wait between two looks at the notice box when there is nothing to generate


class EngineGroup(Protocol):
    """The processes of one tensor-parallel engine (``hpcppo.train.rollout_rank``: a gloo group over the engine's
    world)."""

    def share(self, obj: Any) -> Any:
        """The group's first rank's ``obj``, on every rank (blocks until the first rank sends one)."""
        ...


# what a leader tells its followers (the first item of a command)
WEIGHTS, GENERATE, STOP = "weights", "generate", "stop"


class RolloutWorker:
    """One rollout rank.

    Args:
        end: the bridge (this rollout rank's side).
        engine: the rank's engine (awake for the whole run).
        loop: the agent loop that drives it (``train.rollout_phase.agent_loop``: the same as colocated).
        prompt_at: a data set index -> its prompt (with ``input_ids``, and its ``tools_kwargs`` for the tool loop).
        sampler: a sampler over the same data set, one data-parallel rank: its batches are the trainer's global
            batches, split into ``dp_size`` shares as the trainer ranks' samplers split them.
        sampling: the rollout's sampling parameters (each unit's seed replaces theirs).
        seed: the run's seed (``derive_seed``'s base).
        index: this rank's engine (:func:`~hpcppo.rollout.split.engine_of`); ``rollout_ranks``: how many engines
            there are (the rollout ranks / ``tensor_parallel_size``).
        dp_size: the trainer's data-parallel size.
        max_staleness: ``rollout.max_staleness``.
        total_steps: the run's last step.
        greedy_baseline: also decode one greedy response per prompt (ReMax).
        notice_timeout_s: the longest wait for a notice before the rank gives up (the trainer died).
        group: the engine's group when it spans several ranks (``tensor_parallel_size > 1``), None alone.
        member: this rank's place in ``group`` (0: the leader).
        val_prompt_at: a validation set index -> its prompt (None: the run never validates).
        val_sampling: validation's sampling parameters (``rollout.val_*``; each chunk's seed replaces theirs).
    """

    def __init__(self, end: RolloutEnd, *, engine: RolloutEngine, loop: AgentLoop, prompt_at: Callable[[int], Any],
                 sampler: Sampler, sampling: SamplingParams, seed: int, index: int, rollout_ranks: int,
                 dp_size: int, max_staleness: int, total_steps: int, greedy_baseline: bool = False,
                 notice_timeout_s: float = 1800.0, group: EngineGroup | None = None, member: int = 0,
                 val_prompt_at: Callable[[int], Any] | None = None, val_sampling: SamplingParams | None = None):
        if sampler.dp_size != 1:
            raise ValueError("the rollout rank's sampler must see whole global batches (dp_size 1)")
        self.end = end
        self.engine = engine
        self.loop = loop
        self.prompt_at = prompt_at
        self.sampler = sampler
        self.sampling = sampling
        self.seed = seed
        self.index = index
        self.rollout_ranks = rollout_ranks
        self.dp_size = dp_size
        self.max_staleness = max_staleness
        self.total_steps = total_steps
        self.greedy_baseline = greedy_baseline
        self.notice_timeout_s = notice_timeout_s
        self.group = group
        self.member = member
        self.val_prompt_at = val_prompt_at
        self.val_sampling = val_sampling
        if member and group is None:
            raise ValueError(f"rollout rank {member} of an engine needs the engine's group")
        self.notice: Notice | None = None  # the latest applied
        self.pending: deque[Notice] = deque()  # received, not applied yet (the next unit does not need them)
        self.reset_step = 0  # the step of the last reset
        self.version = -1  # the policy version of the engine's weights
        self.actor_version = -1
        self.branch = 0
        self.batches: dict[int, list[int]] = {}  # step -> its global batch (dataset indices), from the cursor on
        self.next_sampled = 0  # the step the sampler's cursor is at
        self.done: set[tuple[int, int]] = set()  # units sent on this branch
        self.stopped = False
        self.idle_s = 0.0  # waited since the last unit sent
        self.sent = 0

    # ------------------------------------------------------------------ the loop
    def run(self) -> int:
        """Until the stop notice; returns the units sent (a follower sends none)."""
        if self.member:
            return self.follow()
        while True:
            self.pending.extend(_as_list(self.end.poll_notice()))
            self.advance()
            if self.stopped:
                return self.sent
            unit = self.next_unit()
            if unit is None:
                self.wait()
                continue
            self.generate(*unit)

    def wait(self) -> None:
        """Wait for a notice (idle time), failing after ``notice_timeout_s``."""
        start = time.perf_counter()
        while True:
            notices = list(_as_list(self.end.poll_notice()))
            if notices:
                self.idle_s += time.perf_counter() - start
                self.pending.extend(notices)
                return
            if time.perf_counter() - start > self.notice_timeout_s:
                raise TimeoutError(f"rollout rank {self.index}: no notice from trainer rank 0 in "
                                   f"{self.notice_timeout_s:.0f} s (the trainer died or hangs; see its log)")
            time.sleep(NOTICE_POLL_S)

    def advance(self) -> None:
        """Apply the pending notices that take effect now: everything up to the last reset, redo or stop, then those
        of steps up to the next unit's :func:`~hpcppo.rollout.split.generation_step` (all of them when this rank has
        no unit left). A notice held back holds back its weight broadcast, and with it trainer rank 0, until the
        units that need the older weights are sent: they are the ones the trainer takes next."""
        urgent = max((i for i, n in enumerate(self.pending) if n.stop or n.reset is not None or n.redo), default=-1)
        for _ in range(urgent + 1):
            self.apply(self.pending.popleft())
            if self.stopped:
                return
        while self.pending:
            unit = self.next_own()
            if self.notice is not None and unit is not None and \
                    self.pending[0].step > generation_step(unit[0], self.max_staleness, self.reset_step):
                return
            self.apply(self.pending.popleft())

    def apply(self, notice: Notice) -> None:
        """One notice; weights follow a notice that says so."""
        if notice.stop:
            self.tell(STOP)
            self.stopped = True
            return
        if notice.redo:
            self.done.difference_update(notice.redo)
            return  # a redo repeats the step's version: nothing else changes
        if notice.reset is not None:
            self.reset(notice)
        self.notice = notice
        if notice.weights:
            self.tell(WEIGHTS, notice.version)
            self.load_weights(notice.version)
            self.version, self.actor_version = notice.version, notice.actor_version
        if notice.validate is not None:
            self.validate(notice.validate)

    def validate(self, request: Validate) -> None:
        """This engine's chunks of a validation (every ``rollout_ranks``-th from its index), with the weights just
        loaded; one message per chunk."""
        chunks = len(request.seeds)
        for c in range(self.index, chunks, self.rollout_ranks):
            indices, seed = request.chunk(c), request.seeds[c]
            self.tell(GENERATE, indices, seed, True)
            start = time.perf_counter()
            got = self.produce(indices, seed, validation=True)
            log.debug("validation chunk %d of step %d: %d prompts in %.3f s", c, request.step, len(indices),
                      time.perf_counter() - start)
            self.end.send_obj(Validated(step=request.step, chunk=c, generated=got))

    def load_weights(self, expected: int) -> None:
        """Receive the bridge's broadcast (every rollout rank takes part) and load this rank's part of it."""
        start = time.perf_counter()
        version, tensors = self.end.receive_weights()
        if version != expected:
            raise RuntimeError(f"rollout rank {self.index}.{self.member}: weights of version {version} arrived after "
                               f"the notice of version {expected}")
        self.engine.sync_weights(tensors)
        log.debug("weights of version %d loaded in %.3f s", version, time.perf_counter() - start)

    def tell(self, *command: Any) -> None:
        """The leader's command to the engine's other ranks (nothing without a group)."""
        if self.group is not None:
            self.group.share(command)

    def follow(self) -> int:
        """A follower's loop: do what the leader says, in its order, until it says stop; notices are the leader's
        (this rank's own copies are dropped as they come, so the bridge's store does not grow)."""
        assert self.group is not None
        while True:
            command = self.group.share(None)
            self.end.poll_notice()
            if command[0] == STOP:
                self.stopped = True
                return 0
            if command[0] == WEIGHTS:
                self.load_weights(command[1])
                self.version = command[1]
            elif command[0] == GENERATE:
                self.produce(command[1], command[2], validation=command[3])
            else:
                raise RuntimeError(f"rollout rank {self.index}.{self.member}: unknown command {command[0]!r}")

    def reset(self, notice: Notice) -> None:
        """Start again at ``notice.step`` on ``notice.branch`` from the trainer's cursor: nothing sent before counts."""
        assert notice.reset is not None
        self.sampler.load_state_dict(notice.reset)
        self.branch = notice.branch
        self.next_sampled = self.reset_step = notice.step
        self.batches.clear()
        self.done = set(notice.held)  # units the trainer holds already (restored from its checkpoint)

    def next_own(self) -> tuple[int, int] | None:
        """This rank's first unit not yet sent, from the latest notice's step on (the trainer has every earlier one)."""
        if self.notice is None:
            return None
        for step in range(self.notice.step, self.total_steps + 1):
            for dp_rank in range(self.dp_size):
                if owner(step, dp_rank, self.dp_size, self.rollout_ranks) == self.index \
                        and (step, dp_rank) not in self.done:
                    return step, dp_rank
        return None

    def next_unit(self) -> tuple[int, int] | None:
        """The next unit to generate now: this rank's first one not yet sent, when the weights it must come from
        are loaded (:meth:`advance` applies no later notice before it is sent)."""
        unit = self.next_own()
        if unit is None or self.notice is None \
                or generation_step(unit[0], self.max_staleness, self.reset_step) > self.notice.step:
            return None
        return unit

    def global_batch(self, step: int) -> list[int]:
        """The step's prompts (all trainer ranks'), drawn in order from the cursor."""
        while self.next_sampled <= step:
            self.batches[self.next_sampled] = self.sampler.next_batch()
            self.next_sampled += 1
        for old in [s for s in self.batches if s < (self.notice.step if self.notice else 0)]:
            del self.batches[old]
        return self.batches[step]

    def generate(self, step: int, dp_rank: int) -> None:
        batch = self.global_batch(step)
        share = len(batch) // self.dp_size
        indices = batch[dp_rank * share:(dp_rank + 1) * share]
        seed = derive_seed(self.seed, step, dp_rank, self.branch)  # the colocated rank's seed for this share
        self.tell(GENERATE, list(indices), seed, False)
        start = time.perf_counter()
        got = self.produce(list(indices), seed)
        generate_s = time.perf_counter() - start
        got = dataclasses.replace(got, batch=got.batch.stamped(self.actor_version))
        self.end.send_obj(Produced(step=step, dp_rank=dp_rank, branch=self.branch, version=self.version,
                                   indices=tuple(indices), generated=got, generate_s=generate_s, idle_s=self.idle_s,
                                   worker=self.index))
        self.idle_s = 0.0
        self.done.add((step, dp_rank))
        self.sent += 1

    def produce(self, indices: list[int], seed: int, validation: bool = False) -> Generated:
        """Generate a unit's rows (and its greedy baseline) from its prompts, or a validation chunk's from the
        validation set's, as a colocated rank does (:func:`hpcppo.rollout.source.generate`: each row's tools kwargs,
        the tool loop's results): every rank of an engine runs this with the same arguments."""
        if validation:
            if self.val_prompt_at is None or self.val_sampling is None:
                raise RuntimeError(f"rollout rank {self.index}.{self.member}: asked to validate, but it was built "
                                   "without the validation set")
            return generate(self.loop, [self.val_prompt_at(i) for i in indices], self.val_sampling, seed=seed,
                            greedy_baseline=False)
        prompts = [self.prompt_at(i) for i in indices]
        return generate(self.loop, prompts, self.sampling, seed=seed, greedy_baseline=self.greedy_baseline)

def _as_list(notices: Any) -> Iterator[Notice]:
    """``poll_notice``'s answer as notices: a list of them, one, or None."""
    if notices is None:
        return iter(())
    if isinstance(notices, Notice):
        return iter((notices,))
    return iter(notices)
