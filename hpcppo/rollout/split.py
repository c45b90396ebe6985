"""Split placement's rollout source: rollout ranks that never stop generating, trainer ranks that take their samples
within ``rollout.max_staleness`` policy versions (issue 35, docs/rollout-phase.md, docs/placement.md).

The protocol between the two roles, over the bridge (``hpcppo.distributed.bridge``: trainer rank 0 and every
rollout rank):

* A **policy version** counts weight broadcasts (0 = the first). The trainer broadcasts at a step's ``collect``
  when the actor changed since the last one (or after a start or a rollback), so a version rises by at most one per
  step. The batch's per-token ``policy_version`` keeps the colocated unit, the actor version (optimizer steps).
* A **unit** is one data-parallel share of one step: ``(step, dp_rank)``, the prompts trainer ``dp_rank`` samples
  for that step and the seed colocated would use (``derive_seed(seed, step, dp_rank, branch)``), so a rollout rank
  produces exactly the rows a colocated rank would with the same weights. Units are dealt round-robin over the
  rollout engines (:func:`owner`): every engine works, however many trainer ranks there are, and with several
  engines consecutive steps are generated side by side. An engine is one rollout rank, or with
  ``rollout.tensor_parallel_size = k`` a group of k consecutive rollout ranks (:func:`engine_of`): its first rank
  takes the notices and sends the units, the others follow it (:class:`hpcppo.rollout.worker.RolloutWorker`).
* Each ``collect`` sends one :class:`Notice` (the step the trainer now collects, the version it broadcasts or
  holds, a reset when the branch changed) before the weights. A rollout rank generates step ``t`` with the weights
  of step ``t - max_staleness``'s notice (the reset's, when that is later: :func:`generation_step`): it applies a
  notice only when its next unit needs it (:class:`hpcppo.rollout.worker.RolloutWorker`). The version rises by at
  most one per step, so no sample is older than the bound when the trainer reaches its step, and which weights made
  which sample is fixed by the step numbers alone, not by how fast either side runs: a split run is as reproducible
  as a colocated one. With staleness ``k`` the rollout ranks run ``k`` steps ahead; with 0 they generate each step
  after its broadcast (on-policy). The trainer still checks every unit's version and drops one older than the bound
  (``rollout/dropped_stale``, asked for again; it cannot happen when both sides read the same bound).
* A rollback is a **reset**: the notice carries the sampler's cursor before the step, the new branch and the version
  of the restored weights (broadcast with it); every queued or in-flight sample of another branch or an older
  version is discarded, and the rollout ranks regenerate from the cursor.
* A **checkpoint holds the queue** (:meth:`SplitSource.state_dict`): trainer rank 0 waits for the units of the next
  ``max_staleness`` steps (generated with weights the rollout ranks already have, so the wait costs what the next
  step's broadcast would wait anyway) and saves them with the version counter. A resume restores them, and its reset
  tells the rollout ranks which units the trainer holds (:attr:`Notice.held`): they generate from the first unit it
  does not hold, with the checkpoint's weights, exactly as the uninterrupted run did. A resumed split run repeats the
  uninterrupted one's samples and losses at any staleness.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import torch

from hpcppo.rollout.base import RolloutBatch, SamplingParams
from hpcppo.rollout.source import Collected, Generated, PromptSet, StepContext, ValidationChunks, WeightStream
from hpcppo.rollout.tool_loop import LoopStats

log = logging.getLogger("hpcppo.rollout")


class TrainerEnd(Protocol):
    """The bridge as trainer rank 0 sees it (``hpcppo.distributed.bridge.Bridge``, rank 0)."""

    def broadcast_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> Any: ...

    def notify_all(self, obj: Any) -> None: ...

    def recv_any(self, timeout_s: float) -> tuple[int, Any]: ...


class RolloutEnd(Protocol):
    """The bridge as a rollout rank sees it."""

    def receive_weights(self) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]: ...

    def send_obj(self, obj: Any) -> None: ...

    def poll_notice(self) -> Any: ...


@dataclass(frozen=True)
class Validate:
    """A validation asked of the rollout ranks: the validation set in chunks of ``per_call`` prompts (chunk ``c`` is
    prompts ``c * per_call ..``), dealt round-robin over the engines (chunk ``c`` to engine ``c % engines``), chunk
    ``c`` sampled with ``seeds[c]``.

    Attributes:
        step: the step after whose update the trainer validates (the weights are those of step ``step + 1``).
        size: the validation set's size.
        per_call: prompts per chunk.
        seeds: each chunk's seed.
    """

    step: int
    size: int
    per_call: int
    seeds: tuple[int, ...]

    def chunk(self, c: int) -> list[int]:
        """Chunk ``c``'s prompts (validation set indices)."""
        return list(range(c * self.per_call, min(self.size, (c + 1) * self.per_call)))


@dataclass(frozen=True)
class Validated:
    """Rollout rank -> trainer rank 0: one chunk of a validation.

    Attributes:
        step: the validation's step (:attr:`Validate.step`).
        chunk: the chunk's number.
        generated: what the agent loop made of the chunk's prompts (``sampling.n`` rows per prompt, prompt-major).
    """

    step: int
    chunk: int
    generated: Generated


@dataclass(frozen=True)
class Notice:
    """Trainer rank 0 -> rollout ranks, once per ``collect`` (and at the end).

    Attributes:
        step: the step the trainer collects now.
        branch: its branch (rollbacks so far).
        version: the policy version the trainer holds after this notice (broadcast with it when ``weights``).
        actor_version: the actor version of those weights (stamped on the samples, per token).
        weights: a broadcast of ``version``'s weights follows on the bridge.
        reset: the sampler's state before ``step``'s batch: drop everything and regenerate from here (start, resume,
            rollback); None otherwise.
        redo: units the trainer dropped as too old and needs again.
        held: with a reset, units the trainer holds already (restored from a checkpoint): not to be generated.
        validate: generate the validation set with this notice's weights (:class:`Validate`) once they are loaded.
        stop: the run ends; the rollout ranks leave.
    """

    step: int = 0
    branch: int = 0
    version: int = 0
    actor_version: int = 0
    weights: bool = False
    reset: dict[str, int] | None = None
    redo: tuple[tuple[int, int], ...] = ()
    held: tuple[tuple[int, int], ...] = ()
    validate: Validate | None = None
    stop: bool = False


@dataclass(frozen=True)
class Produced:
    """Rollout rank -> trainer rank 0: one unit's samples (CPU tensors).

    Attributes:
        step, dp_rank: the unit.
        branch: the branch whose seed sampled it.
        version: the policy version of the weights that generated it.
        indices: the data set indices of its prompts (the trainer checks them against its own sampler's).
        generated: the samples (``policy_version`` stamped with the actor version), ReMax's greedy responses and the
            tool loop's results and counts (a multi-turn run's), as a colocated rank's ``generate`` gives them.
        generate_s: seconds spent generating it.
        idle_s: seconds the rollout rank waited for work (a notice, weights) since its previous unit.
        worker: the engine's index (:func:`engine_of`).
    """

    step: int
    dp_rank: int
    branch: int
    version: int
    indices: tuple[int, ...]
    generated: Generated
    generate_s: float
    idle_s: float
    worker: int


def owner(step: int, dp_rank: int, dp_size: int, engines: int) -> int:
    """The rollout engine that generates unit ``(step, dp_rank)``: round-robin over units, so every engine has work
    and consecutive steps go to different engines when there are more engines than trainer groups."""
    return (step * dp_size + dp_rank) % engines


def engine_of(index: int, tensor_parallel_size: int) -> tuple[int, int]:
    """Rollout rank ``index``'s engine and its rank in the engine's tensor-parallel group: ``k`` consecutive rollout
    ranks form one engine (they are on one node: compile checks that ``k`` divides the rollout ranks of a node, and
    a node's rollout ranks are consecutive, hpcppo.placement)."""
    return divmod(index, tensor_parallel_size)


def generation_step(step: int, max_staleness: int, reset_step: int) -> int:
    """The step whose notice's weights generate ``step``: ``max_staleness`` steps earlier, or the last reset's step
    when that is later (the weights before a reset belong to a discarded branch or a previous attempt)."""
    return max(step - max_staleness, reset_step)


@dataclass
class SplitStats:
    """What one ``collect`` saw, for the step's metrics."""

    staleness: list[int] = field(default_factory=list)
    dropped_stale: int = 0
    discarded: int = 0  # samples of a discarded branch or from before a reset (a rollback's)
    rollout_idle_s: float = 0.0
    broadcast_bytes: int = 0
    broadcast_s: float = 0.0  # moving the bytes (and gathering them), the wait for the receivers excluded


def _counted(weights: Iterable[tuple[str, torch.Tensor]], stats: SplitStats) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        stats.broadcast_bytes += tensor.numel() * tensor.element_size()
        yield name, tensor


class SplitSource:
    """The trainer's side of split placement: every trainer rank calls :meth:`collect` (the weights are gathered
    collectively); trainer rank 0 alone holds the bridge (``end``), takes the units and shares them.

    Args:
        end: the bridge on trainer rank 0; None on the other trainer ranks.
        weights: the actor's weights as a collective stream (:data:`WeightStream`).
        weights_dtype: the dtype to gather them in (the rollout engine's; None = as they are).
        prompts: this trainer rank's prompts of the step (advances the sampler, as colocated).
        sampler_state: the sampler's cursor now (before :attr:`prompts` is called), for a reset.
        share: rank 0's object on every trainer rank (``broadcast_object`` over the trainer group).
        dp_rank, dp_size: this trainer rank's data-parallel place.
        max_staleness: ``rollout.max_staleness``.
        total_steps: the run's last step (the rollout ranks generate nothing past it).
        timeout_s: the longest wait for one unit before the run fails (a rollout rank that died).
        validation: the trainer ranks' own engine for validation (colocated), when the run validates.
    """

    def __init__(self, end: TrainerEnd | None, *, weights: WeightStream, weights_dtype: torch.dtype | None,
                 prompts: Callable[[], list[Any]], sampler_state: Callable[[], dict[str, int]],
                 share: Callable[[Any], Any], dp_rank: int, dp_size: int, max_staleness: int, total_steps: int,
                 timeout_s: float = 1800.0):
        self.end = end
        self.weights = weights
        self.weights_dtype = weights_dtype
        self.prompts = prompts
        self.sampler_state = sampler_state
        self.share = share
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.max_staleness = max_staleness
        self.total_steps = total_steps
        self.timeout_s = timeout_s
        self.version = -1  # the policy version last broadcast; -1: none yet
        self.actor_version = -1  # the actor version it holds
        self.branch = -1
        self.floor = 0  # the oldest version a sample may have: the reset's (older ones belong to a discarded branch)
        self.queue: dict[tuple[int, int], Produced] = {}  # rank 0: units received ahead of their step
        self.early = SplitStats()  # rank 0: what units received by a checkpoint's wait add to the next step's metrics
        self.restored: dict[str, Any] | None = None  # a checkpoint's state (load_state_dict), until the next collect
        self.validated: dict[tuple[int, int], Validated] = {}  # rank 0: validation chunks by (step, chunk)
        self.trained: list[tuple[int, int, int, int]] = []  # rank 0: (step, dp_rank, branch, version) of each unit used

    def collect(self, ctx: StepContext) -> Collected:
        times: dict[str, float] = {}
        stats, self.early = self.early, SplitStats()
        announced, waited = self._announce(ctx.step, ctx.branch, ctx.actor_version, stats)
        times["weight_sync"] = announced - waited
        prompts = self.prompts()
        start = time.perf_counter()
        got = self._take(ctx, stats) if self.end is not None else None
        shares: list[tuple[Produced, dict[str, float], float]] = self.share(got)
        mine, metrics, generate_s = shares[self.dp_rank]
        times["trainer_idle"] = time.perf_counter() - start + waited
        times["generate"] = generate_s
        expected = tuple(int(p.index) for p in prompts)
        if mine.indices != expected:
            raise RuntimeError(f"step {ctx.step}: the rollout rank generated prompts {list(mine.indices)[:4]}... for "
                               f"trainer rank {self.dp_rank}, whose sampler gives {list(expected)[:4]}...")
        g = mine.generated
        return Collected(batch=g.batch, prompts=prompts, greedy=g.greedy, times=times, metrics=metrics,
                         tool_stats=g.tool_stats, tool_rewards=g.tool_rewards, tool_scores=g.tool_scores,
                         greedy_tool_rewards=g.greedy_tool_rewards, greedy_tool_scores=g.greedy_tool_scores)

    def _announce(self, step: int, branch: int, actor_version: int, stats: SplitStats,
                  validate: Validate | None = None) -> tuple[float, float]:
        """Send the notice of ``step`` (a reset when the branch changed or nothing was sent yet) and, when the actor
        changed, broadcast its weights (collective: every trainer rank gathers them). Before the step's prompts are
        drawn (a reset carries the sampler's cursor). Returns the seconds it took and, on rank 0, how many of them
        went by waiting for the rollout ranks to take the weights (they were generating units that need older
        ones: trainer idle time)."""
        reset = branch != self.branch or self.version < 0
        state = self.sampler_state() if reset else None
        broadcast = reset or actor_version != self.actor_version
        restored, self.restored = self.restored, None
        if broadcast:
            # after a resume, the version the uninterrupted run held at this step (the checkpoint counted it)
            self.version = int(restored["version"]) if restored is not None else self.version + 1
            self.actor_version = actor_version
        held: tuple[tuple[int, int], ...] = ()
        waited = 0.0
        if reset:
            self.branch, self.floor = branch, self.version
            if restored is not None:
                held = self._restore_queue(restored, step)
        notice = Notice(step=step, branch=branch, version=self.version, actor_version=actor_version,
                        weights=broadcast, reset=state, held=held, validate=validate)
        start = time.perf_counter()
        if self.end is not None:
            self.end.notify_all(notice)
        if broadcast:
            stream = _counted(self.weights(dtype=self.weights_dtype, into=None), stats)
            if self.end is not None:
                begin = time.perf_counter()
                sent = self.end.broadcast_weights(stream, self.version)
                waited = float(getattr(sent, "waited", 0.0))
                stats.broadcast_s = time.perf_counter() - begin - waited
            else:
                for _ in stream:  # this rank's part of the collective gather
                    pass
        return time.perf_counter() - start, waited

    def _take(self, ctx: StepContext, stats: SplitStats) -> list[tuple[Produced, dict[str, float], float]]:
        """Rank 0: the step's units, each within the bound: ``(unit, metrics, generate_s)`` per trainer rank."""
        assert self.end is not None
        wanted = {(ctx.step, d) for d in range(self.dp_size)}
        for key in list(self.queue):
            self._admit(self.queue.pop(key), ctx.step, stats)
        self._await(wanted, ctx.step, stats)
        units = [self.queue.pop(k) for k in sorted(wanted)]
        generate_s = max(u.generate_s for u in units)
        for u in units:
            stats.staleness.append(self.version - u.version)
            self.trained.append((u.step, u.dp_rank, u.branch, u.version))
        metrics = {"rollout/staleness_mean": sum(stats.staleness) / len(stats.staleness),
                   "rollout/staleness_max": float(max(stats.staleness)),
                   "rollout/dropped_stale": float(stats.dropped_stale),
                   "time/rollout_idle_s": stats.rollout_idle_s}
        if stats.broadcast_s > 0:
            metrics["perf/weight_broadcast_gbps"] = stats.broadcast_bytes / stats.broadcast_s / 1e9
        if stats.discarded:
            log.info("step %d: %d unit(s) of a discarded branch or older weights dropped", ctx.step, stats.discarded)
        log.info("step %d: trained units %s (trainer rank/branch/policy version/rollout engine; policy version now %d)",
                 ctx.step, " ".join(f"{u.dp_rank}/{u.branch}/{u.version}/{u.worker}" for u in units), self.version)
        return [(u, metrics, generate_s) for u in units]

    def _await(self, wanted: set[tuple[int, int]], step: int, stats: SplitStats) -> None:
        """Rank 0: receive units until every one of ``wanted`` is queued (``step``: the step the trainer collects
        next), failing after ``timeout_s``."""
        assert self.end is not None
        deadline = time.monotonic() + self.timeout_s
        while not wanted <= self.queue.keys():
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(wanted - self.queue.keys())
                raise TimeoutError(f"step {step}: no samples for units {missing} from the rollout ranks in "
                                   f"{self.timeout_s:.0f} s (a rollout rank died or hangs; see its log)")
            self._receive(left, step, stats)

    def _receive(self, timeout_s: float, step: int, stats: SplitStats) -> None:
        """Rank 0: the next message from a rollout rank: a unit (admitted) or a validation chunk (kept)."""
        assert self.end is not None
        _, got = self.end.recv_any(timeout_s=timeout_s)
        if isinstance(got, Validated):
            self.validated[(got.step, got.chunk)] = got
        else:
            self._admit(got, step, stats)

    def _admit(self, unit: Produced, step: int, stats: SplitStats) -> None:
        """Queue a received unit, or drop it: another branch or before the last reset (discarded), older than the
        bound at its own step (``rollout/dropped_stale``, asked for again), or a step already trained (``step``: the
        one the trainer collects now, or next when a checkpoint waits)."""
        assert self.end is not None
        stats.rollout_idle_s += unit.idle_s
        if unit.branch != self.branch or unit.version < self.floor or unit.step < step:
            stats.discarded += 1
            return
        if unit.step == step and self.version - unit.version > self.max_staleness:
            stats.dropped_stale += 1
            self.end.notify_all(Notice(step=step, branch=self.branch, version=self.version,
                                       actor_version=self.actor_version, redo=((unit.step, unit.dp_rank),)))
            return
        self.queue[(unit.step, unit.dp_rank)] = unit

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self, step: int, branch: int, actor_version: int) -> dict[str, Any]:
        """What a checkpoint of ``step`` (on ``branch``, the actor at ``actor_version``) needs for an exact resume:
        the version the trainer will hold at the next step, and on rank 0 the units of the next ``max_staleness``
        steps, waited for (plain tensors and numbers: ``torch.load(weights_only=True)`` reads them). After a
        rollback (``branch`` is not the source's yet) the next step is a reset and nothing is queued: the resumed
        run regenerates, as the uninterrupted one does."""
        pending_reset = branch != self.branch or self.version < 0
        version = self.version + 1 if pending_reset or actor_version != self.actor_version else self.version
        units: list[dict[str, Any]] = []
        if self.end is not None and not pending_reset:
            last = min(self.total_steps, step + self.max_staleness)
            wanted = {(t, d) for t in range(step + 1, last + 1) for d in range(self.dp_size)}
            self._await(wanted, step + 1, self.early)
            units = [unit_state(self.queue[k]) for k in sorted(wanted)]
        return {"version": version, "branch": branch, "units": units}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint's :meth:`state_dict`: taken at the next :meth:`collect`, the resume's reset."""
        self.restored = state

    def _restore_queue(self, restored: dict[str, Any], step: int) -> tuple[tuple[int, int], ...]:
        """Rank 0: queue the checkpoint's units of this branch from this step on; the units it holds (every rank
        returns them: the notice carries them to the rollout ranks)."""
        units = [unit_from_state(u) for u in restored.get("units", ())]
        units = [u for u in units if u.branch == self.branch and u.step >= step]
        if self.end is not None:
            for u in units:
                self.queue[(u.step, u.dp_rank)] = u
        self.floor = min([self.floor] + [u.version for u in units])  # older versions, of the uninterrupted run
        if units:
            log.info("step %d: %d unit(s) restored from the checkpoint (steps %d..%d)", step, len(units),
                     units[0].step, units[-1].step)
        return tuple(sorted((u.step, u.dp_rank) for u in units))

    def validation(self, ctx: StepContext, prompts: PromptSet, sampling: SamplingParams,
                   seed_of: Callable[[int], int], per_call: int) -> ValidationChunks:
        """The rollout ranks generate the validation set with the actor's weights after step ``ctx.step``: the
        notice of step ``ctx.step + 1`` goes out now with those weights and the request (:class:`Validate`; the
        rollout ranks take it after the units that need older weights, so the samples of later steps come from the
        weights they would without a validation). Rank 0 gathers every chunk and shares them; trainer rank ``r``
        gets chunks ``r``, ``r + dp_size``, ... (``sampling`` is the rollout ranks' own copy's; ``seed_of(c)`` chunk
        ``c``'s seed)."""
        chunks = -(-len(prompts) // per_call)
        request = Validate(step=ctx.step, size=len(prompts), per_call=per_call,
                           seeds=tuple(seed_of(c) for c in range(chunks)))
        stats = self.early  # units received meanwhile count in the next step's metrics
        self._announce(ctx.step + 1, ctx.branch, ctx.actor_version, stats, validate=request)
        got: dict[int, Generated] | None = None
        if self.end is not None:
            deadline = time.monotonic() + self.timeout_s
            while not all((ctx.step, c) in self.validated for c in range(chunks)):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [c for c in range(chunks) if (ctx.step, c) not in self.validated]
                    raise TimeoutError(f"step {ctx.step}: no validation chunks {missing[:8]} from the rollout ranks "
                                       f"in {self.timeout_s:.0f} s (a rollout rank died or hangs; see its log)")
                self._receive(left, ctx.step + 1, stats)
            got = {c: self.validated.pop((ctx.step, c)).generated for c in range(chunks)}
        shared: dict[int, Generated] = self.share(got)
        for c in range(self.dp_rank, chunks, self.dp_size):
            yield [prompts[i] for i in request.chunk(c)], shared[c]

    def stop(self) -> None:
        """Rank 0: tell the rollout ranks the run ends."""
        if self.end is not None:
            self.end.notify_all(Notice(stop=True))


def unit_state(unit: Produced) -> dict[str, Any]:
    """A unit as plain containers of tensors and numbers (a checkpoint's ``extra`` is loaded with
    ``weights_only=True``)."""
    g = unit.generated
    stats = None
    if g.tool_stats is not None:
        stats = {f.name: getattr(g.tool_stats, f.name) for f in fields(g.tool_stats)}
        stats["calls"], stats["failures"] = dict(stats["calls"]), dict(stats["failures"])
    generated = {"batch": _batch_state(g.batch), "greedy": _batch_state(g.greedy), "tool_stats": stats,
                 "tool_rewards": g.tool_rewards, "tool_scores": g.tool_scores,
                 "greedy_tool_rewards": g.greedy_tool_rewards, "greedy_tool_scores": g.greedy_tool_scores}
    return {"step": unit.step, "dp_rank": unit.dp_rank, "branch": unit.branch, "version": unit.version,
            "indices": list(unit.indices), "generated": generated, "generate_s": unit.generate_s,
            "idle_s": unit.idle_s, "worker": unit.worker}


def unit_from_state(state: dict[str, Any]) -> Produced:
    """:func:`unit_state`'s inverse."""
    g = dict(state["generated"])
    stats = g.pop("tool_stats")
    if stats is not None:
        stats = LoopStats(**(stats | {"calls": Counter(stats["calls"]), "failures": Counter(stats["failures"])}))
    generated = Generated(batch=RolloutBatch.from_state(g.pop("batch")), greedy=_batch_from_state(g.pop("greedy")),
                          tool_stats=stats, **g)
    return Produced(step=int(state["step"]), dp_rank=int(state["dp_rank"]), branch=int(state["branch"]),
                    version=int(state["version"]), indices=tuple(int(i) for i in state["indices"]),
                    generated=generated, generate_s=float(state["generate_s"]), idle_s=float(state["idle_s"]),
                    worker=int(state["worker"]))


def _batch_state(batch: RolloutBatch | None) -> dict[str, torch.Tensor] | None:
    return None if batch is None else batch.state()


def _batch_from_state(state: dict[str, torch.Tensor] | None) -> RolloutBatch | None:
    return None if state is None else RolloutBatch.from_state(state)
