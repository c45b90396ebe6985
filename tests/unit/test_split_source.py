"""Split placement's protocol (hpcppo.rollout.split, hpcppo.rollout.worker): the staleness bound, drop counting,
version stamping, rollback drops, with the real SplitSource and RolloutWorker in one process.

Stand-ins, named as such: ``StandInBridge`` (queues in one process instead of hpcppo.distributed.bridge's store and
process group: a weight broadcast does not block until the receivers join), ``StandInEngine`` (its "model" is one
number, the actor version it was sent, written into every response so a test can read which weights generated it;
it logs what it was asked, so the ranks of one tensor-parallel engine can be compared) and ``StandInEngineGroup``
(queues instead of hpcppo.train.rollout_rank.GlooEngineGroup's broadcast: the leader does not wait for the others).
"""

from __future__ import annotations

import io
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from hpcppo.data.sampler import ShardedEpochSampler
from hpcppo.rollout.agent_loop import SingleTurnLoop
from hpcppo.rollout.base import RolloutBatch, batch_from_lists, derive_seed
from hpcppo.rollout.source import Generated, StepContext
from hpcppo.rollout.split import (Notice, Produced, SplitSource, engine_of, generation_step, owner, unit_from_state,
                                  unit_state)
from hpcppo.rollout.tool_loop import LoopStats
from hpcppo.rollout.worker import RolloutWorker

EOS, PAD = 99, 0
SEED = 7
PROMPTS = 16  # data set size
PER_STEP = 4  # prompts per step (global)


@dataclass
class Item:
    index: int
    input_ids: list[int]


DATA = [Item(i, [10 + i, 3]) for i in range(PROMPTS)]
VAL = [Item(i, [50 + i, 4]) for i in range(7)]  # the validation set


class StandInBridge:
    """In-process stand-in for hpcppo.distributed.bridge.Bridge: one trainer end, ``ranks`` rollout ends."""

    def __init__(self, ranks: int):
        self.inbox: queue.Queue[tuple[int, Any]] = queue.Queue()
        self.notices = [queue.Queue[Any]() for _ in range(ranks)]
        self.weights = [queue.Queue[Any]() for _ in range(ranks)]
        self.sent = 0  # units sent by all rollout ends
        self.senders: list[int] = []  # the bridge rank of each unit's sender

    # trainer rank 0
    def notify_all(self, obj: Any) -> None:
        for q in self.notices:
            q.put(obj)

    def broadcast_weights(self, named: Any, version: int) -> None:
        tensors = [(n, t.detach().clone()) for n, t in named]
        for q in self.weights:
            q.put((version, tensors))

    def recv_any(self, timeout_s: float) -> tuple[int, Any]:
        return self.inbox.get(timeout=timeout_s)

    def end(self, rank: int) -> "StandInRolloutEnd":
        return StandInRolloutEnd(self, rank)


class StandInRolloutEnd:
    def __init__(self, bridge: StandInBridge, rank: int):
        self.bridge, self.rank = bridge, rank

    def receive_weights(self) -> tuple[int, Any]:
        version, tensors = self.bridge.weights[self.rank].get(timeout=30)
        return version, iter(tensors)

    def send_obj(self, obj: Any) -> None:
        self.bridge.senders.append(self.rank + 1)
        self.bridge.inbox.put((self.rank + 1, obj))
        self.bridge.sent += 1

    def poll_notice(self) -> list[Any]:
        out = []
        while True:
            try:
                out.append(self.bridge.notices[self.rank].get_nowait())
            except queue.Empty:
                return out


class StandInEngine:
    """Generates ``[weight, seed % 89 + 1, EOS]`` for every sample: the weights that made it can be read back.
    ``jitter_s``: each generate sleeps a random time up to this (the rollout rank's speed varies)."""

    def __init__(self, jitter_s: float = 0.0, seed: int = 0) -> None:
        self.w = -1.0
        self.calls: list[tuple[Any, ...]] = []  # ("load", w) and ("generate", prompts, seed, n, w), in order
        self.jitter_s = jitter_s
        self.rng = random.Random(seed)

    def generate(self, prompts: Any, sampling: Any) -> RolloutBatch:
        if self.jitter_s:
            time.sleep(self.rng.uniform(0, self.jitter_s))
        self.calls.append(("generate", [list(p) for p in prompts], sampling.seed, sampling.n, self.w))
        rows = [[int(self.w) + 1, sampling.seed % 89 + 1, EOS] for _ in range(len(prompts) * sampling.n)]
        return batch_from_lists(prompts, rows, [[0.0] * 3 for _ in rows], n=sampling.n, eos_token_ids=[EOS],
                                pad_token_id=PAD)

    def sync_weights(self, named: Any) -> int:
        for _, t in named:
            self.w = float(t)
        self.calls.append(("load", self.w))
        return 1


class StandInEngineGroup:
    """In-process stand-in for GlooEngineGroup: the leader's objects reach each other rank through a queue."""

    def __init__(self, size: int):
        self.boxes = [queue.Queue[Any]() for _ in range(size)]

    def member(self, rank: int) -> Any:
        group = self

        class Member:
            def share(self, obj: Any) -> Any:
                if rank == 0:
                    for box in group.boxes[1:]:
                        box.put(obj)
                    return obj
                return group.boxes[rank].get(timeout=30)

        return Member()


@dataclass
class Sampling:
    n: int = 2
    seed: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1


class Harness:
    """A trainer (one or more data-parallel shares, all on rank 0's SplitSource) and its rollout ranks in threads."""

    def __init__(self, *, max_staleness: int, rollout_ranks: int = 1, dp_size: int = 1, total_steps: int = 8,
                 worker_staleness: int | None = None, tensor_parallel_size: int = 1, jitter_s: float = 0.0,
                 weight_offset: int = 0, restored: dict[str, Any] | None = None,
                 sampler_state: dict[str, Any] | None = None):
        """``weight_offset``: the weights' value minus ``actor_version`` (a resumed trainer counts actor versions
        afresh); ``restored``, ``sampler_state``: a checkpoint's source state and sampler cursor to resume from."""
        tp = tensor_parallel_size
        groups = [StandInEngineGroup(tp) for _ in range(rollout_ranks // tp)]
        self.bridge = StandInBridge(rollout_ranks)
        self.actor_version = 0
        self.sampler = ShardedEpochSampler(PROMPTS, batch_size=PER_STEP, dp_rank=0, dp_size=dp_size, seed=SEED)
        if sampler_state is not None:
            self.sampler.load_state_dict(sampler_state)
        self.source = SplitSource(
            self.bridge, weights=lambda **_: iter([("w", torch.tensor(float(self.actor_version + weight_offset)))]),
            weights_dtype=None, prompts=lambda: [DATA[i] for i in self.sampler.next_batch()],
            sampler_state=self.sampler.state_dict, share=lambda x: x, dp_rank=0, dp_size=dp_size,
            max_staleness=max_staleness, total_steps=total_steps, timeout_s=30)
        if restored is not None:
            self.source.load_state_dict(restored)
        self.workers = []
        self.engines = []
        for r in range(rollout_ranks):
            engine = StandInEngine(jitter_s, seed=r)
            self.engines.append(engine)
            index, member = engine_of(r, tp)
            self.workers.append(RolloutWorker(
                self.bridge.end(r), engine=engine, loop=SingleTurnLoop(engine),  # type: ignore[arg-type]
                prompt_at=DATA.__getitem__,
                sampler=ShardedEpochSampler(PROMPTS, batch_size=PER_STEP, dp_rank=0, dp_size=1, seed=SEED),
                sampling=Sampling(), seed=SEED, index=index,  # type: ignore[arg-type]
                rollout_ranks=rollout_ranks // tp,
                dp_size=dp_size, max_staleness=max_staleness if worker_staleness is None else worker_staleness,
                total_steps=total_steps, notice_timeout_s=30,
                group=groups[index].member(member) if tp > 1 else None, member=member,
                val_prompt_at=VAL.__getitem__, val_sampling=Sampling(n=1)))
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(w,), daemon=True) for w in self.workers]
        for t in self.threads:
            t.start()

    def _run(self, worker: RolloutWorker) -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - reported by close()
            self.errors.append(exc)

    def collect(self, step: int, branch: int = 0) -> Any:
        got = self.source.collect(StepContext(step=step, branch=branch, actor_version=self.actor_version,
                                              seed=derive_seed(SEED, step, 0, branch)))
        return got

    def settle(self, sent: int) -> None:
        """Wait until the rollout ranks have sent ``sent`` units in all (what they may generate ahead)."""
        deadline = time.monotonic() + 30
        while self.bridge.sent < sent:
            assert time.monotonic() < deadline, f"only {self.bridge.sent} of {sent} units sent"
            time.sleep(0.002)

    def close(self) -> None:
        self.source.stop()
        for t in self.threads:
            t.join(timeout=30)
        assert not self.errors, self.errors


def weight_of(batch: RolloutBatch) -> int:
    """The actor version the stand-in engine held when it generated the batch (all rows alike)."""
    values = {int(x) - 1 for x in batch.response_ids[:, 0]}
    assert len(values) == 1
    return values.pop()


def test_generation_step_and_owner() -> None:
    assert generation_step(5, 0, 1) == 5 and generation_step(7, 2, 1) == 5
    assert generation_step(3, 2, 2) == 2  # before the reset's step: the reset's weights
    assert [owner(s, d, 2, 3) for s in (0, 1) for d in (0, 1)] == [0, 1, 2, 0]


@pytest.mark.parametrize("k,engines,dp", [(1, 1, 1), (2, 1, 2), (2, 2, 1), (3, 2, 2)])
def test_which_weights_make_a_unit_depends_on_its_step_not_on_timing(k: int, engines: int, dp: int) -> None:
    # Rollout ranks and trainer at random speeds: every unit of step t comes from the weights of step t - k's
    # collect (the first step's before that), never newer ones that happened to arrive first.
    h = Harness(max_staleness=k, rollout_ranks=engines, dp_size=dp, total_steps=10, jitter_s=0.01)
    rng = random.Random(k * 10 + engines)
    try:
        for step in range(1, 11):
            got = h.collect(step)
            assert weight_of(got.batch) == max(step - k, 1) - 1, step  # actor version at step s's collect: s - 1
            assert got.metrics["rollout/staleness_max"] == min(step - 1, k)
            time.sleep(rng.uniform(0, 0.02))  # the update
            h.actor_version += 1
    finally:
        h.close()
    assert [v for _, _, _, v in h.source.trained] == [max(s - k, 1) - 1 for s in range(1, 11) for _ in range(dp)]


@pytest.mark.parametrize("k,validate", [(0, False), (1, False), (3, False), (2, True)])
def test_a_resume_from_the_checkpointed_queue_repeats_the_uninterrupted_run(k: int, validate: bool) -> None:
    # The uninterrupted run: 8 steps. The interrupted one: the same 4 steps, a checkpoint of step 4 (its queue), a
    # new trainer and new rollout ranks from it (actor versions counted afresh, as a resumed trainer does). With
    # `validate`, both validate after step 4, before the checkpoint (the next step's notice has gone out early).
    def step(h: Harness, t: int, out: list) -> None:
        got = h.collect(t)
        out.append((got.batch.response_ids.tolist(), got.metrics["rollout/staleness_max"]))
        h.actor_version += 1
        if validate and t == 4:
            ctx = StepContext(step=t, branch=0, actor_version=h.actor_version, seed=0)
            out.append([g.batch.response_ids.tolist() for _, g in h.source.validation(
                ctx, VAL, Sampling(n=1), lambda c: 100 + c, 3)])

    def run(h: Harness, steps: range) -> list:
        out: list = []
        try:
            for t in steps:
                step(h, t, out)
        finally:
            h.close()
        return out

    straight = Harness(max_staleness=k, rollout_ranks=2, dp_size=2, total_steps=8, jitter_s=0.005)
    whole = run(straight, range(1, 9))
    first = Harness(max_staleness=k, rollout_ranks=2, dp_size=2, total_steps=8, jitter_s=0.005)
    head: list = []
    try:
        for t in range(1, 5):
            step(first, t, head)
        saved = first.source.state_dict(4, 0, first.actor_version)
        cursor = first.sampler.state_dict()
    finally:
        first.close()
    assert len(saved["units"]) == 2 * min(k, 4)  # steps 5..4+k, both trainer ranks
    assert saved["version"] == 4  # the version step 5 broadcasts: one per step from 0
    torch.save(saved, buf := io.BytesIO())
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    resumed = Harness(max_staleness=k, rollout_ranks=2, dp_size=2, total_steps=8, jitter_s=0.005,
                      weight_offset=3, restored=saved, sampler_state=cursor)
    resumed.actor_version = 1
    tail = run(resumed, range(5, 9))
    assert head + tail == whole
    if validate:  # the validation (after the 4 steps' entries) came from the weights after step 4's update
        assert all(row[0] - 1 == 4 for chunk in whole[4] for row in chunk)
    assert [u[:2] for u in resumed.source.trained] == [(s, d) for s in range(5, 9) for d in (0, 1)]
    assert [u[3] for u in resumed.source.trained] == [u[3] for u in straight.source.trained[8:]]
    generated = sum(1 for e in resumed.engines for c in e.calls if c[0] == "generate")
    assert generated == 2 * (4 - min(k, 4))  # the restored units are not generated again


@pytest.mark.parametrize("k", [0, 1, 2])
def test_staleness_bound_reached_and_kept_and_versions_stamped(k: int) -> None:
    h = Harness(max_staleness=k, total_steps=8)
    stale = []
    try:
        for step in range(1, 9):
            got = h.collect(step)
            # The trainer is slower than the rollout: the rollout rank generates as far ahead as the bound allows.
            h.settle(min(8, step + k))
            made_with = weight_of(got.batch)
            assert set(got.batch.policy_version[got.batch.response_attention_mask.bool()].tolist()) == {made_with}
            stale.append(int(got.metrics["rollout/staleness_max"]))
            assert got.metrics["rollout/dropped_stale"] == 0
            assert self_consistent(got, step)
            h.actor_version += 1  # one update per step: one broadcast per step
    finally:
        h.close()
    assert max(stale) == k  # the pipeline is k steps deep, not less
    assert stale[k:] == [k] * (8 - k)


def self_consistent(got: Any, step: int) -> bool:
    """The batch answers the step's prompts with the colocated seed of this step."""
    return all(int(x) == derive_seed(SEED, step, 0) % 89 + 1 for x in got.batch.response_ids[:, 1])


def test_staleness_zero_is_on_policy() -> None:
    h = Harness(max_staleness=0, total_steps=5)
    try:
        for step in range(1, 6):
            got = h.collect(step)
            assert weight_of(got.batch) == h.actor_version  # generated with the weights the trainer holds
            h.actor_version += 1
    finally:
        h.close()


def test_too_old_batch_is_dropped_counted_and_regenerated() -> None:
    # The rollout rank believes it may run 3 steps ahead; the trainer allows 1: what it made too early is dropped.
    h = Harness(max_staleness=1, worker_staleness=3, total_steps=6)
    dropped = 0.0
    try:
        for step in range(1, 7):
            got = h.collect(step)
            h.settle(min(6, step + 3) + int(dropped))
            dropped += got.metrics["rollout/dropped_stale"]
            assert got.metrics["rollout/staleness_max"] <= 1
            h.actor_version += 1
    finally:
        h.close()
    assert dropped >= 2


def test_two_trainer_shares_and_two_rollout_ranks_all_work() -> None:
    h = Harness(max_staleness=1, rollout_ranks=2, dp_size=2, total_steps=4)
    try:
        for step in range(1, 5):
            h.collect(step)
            h.actor_version += 1
    finally:
        h.close()
    assert all(w.sent > 0 for w in h.workers)  # no idle rollout rank
    assert sorted((s, d) for s, d, _, _ in h.source.trained) == [(s, d) for s in range(1, 5) for d in (0, 1)]


def test_engine_of_groups_consecutive_rollout_ranks() -> None:
    assert [engine_of(i, 2) for i in range(6)] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert [engine_of(i, 4) for i in range(8)] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert [engine_of(i, 1) for i in range(3)] == [(0, 0), (1, 0), (2, 0)]


def test_tensor_parallel_groups_are_the_unit_of_dealing_and_only_leaders_send() -> None:
    # 4 rollout ranks at TP 2 = 2 engines (ranks 0+1, 2+3); 2 trainer shares per step; a rollback midway
    h = Harness(max_staleness=1, rollout_ranks=4, dp_size=2, total_steps=6, tensor_parallel_size=2)
    try:
        for step in range(1, 4):
            h.collect(step)
            h.actor_version += 1
        h.actor_version = 50
        for step in range(4, 7):
            got = h.collect(step, branch=1)
            assert weight_of(got.batch) >= 50
            h.actor_version += 1
    finally:
        h.close()
    assert set(h.bridge.senders) == {1, 3}  # bridge ranks of rollout ranks 0 and 2, the engines' first ranks
    assert [w.sent for w in h.workers][1::2] == [0, 0] and all(w.sent > 0 for w in h.workers[0::2])
    assert sorted((s, d) for s, d, _, _ in h.source.trained) == [(s, d) for s in range(1, 7) for d in (0, 1)]
    for leader, follower in ((0, 1), (2, 3)):
        # one engine: the same weight loads and the same generate calls (prompts, seed, weights), in the same order
        assert h.engines[leader].calls == h.engines[follower].calls
        assert any(c[0] == "generate" for c in h.engines[leader].calls)
    # units dealt round robin over the engines, not the ranks: each engine generated whole units of its own
    made = [{(tuple(map(tuple, c[1])), c[2]) for c in h.engines[r].calls if c[0] == "generate"} for r in (0, 2)]
    assert made[0] and made[1] and not made[0] & made[1]


def test_rollback_drops_queued_and_in_flight_samples_of_the_discarded_branch() -> None:
    h = Harness(max_staleness=2, total_steps=8)
    try:
        for step in range(1, 5):
            h.collect(step)
            h.settle(min(8, step + 2))  # steps 5 and 6 of branch 0 are queued now
            h.actor_version += 1
        # Rolled back to the checkpoint of step 4 (the last one): branch 1, the restored weights' actor version
        # (here: new ones). Steps 5 and 6 of branch 0 wait in the bridge's inbox, exactly the next steps' units.
        h.actor_version = 50
        before = len(h.source.trained)
        for step in range(5, 9):
            got = h.collect(step, branch=1)
            assert weight_of(got.batch) >= 50  # never the discarded branch's weights
            assert all(int(x) == derive_seed(SEED, step, 0, 1) % 89 + 1 for x in got.batch.response_ids[:, 1])
            h.actor_version += 1
    finally:
        h.close()
    after = h.source.trained[before:]
    assert [s for s, _, _, _ in after] == list(range(5, 9))
    assert all(branch == 1 and version >= h.source.floor for _, _, branch, version in after)


def test_a_unit_for_another_trainer_rank_order_is_refused() -> None:
    # The sampler the trainer reads must be the one the rollout ranks copy: a mismatch is an error, not a silent mix.
    h = Harness(max_staleness=0, total_steps=3)
    try:
        h.sampler.next_batch()  # the trainer's cursor moves ahead of the rollout rank's copy
        h.source.version = 0  # no reset: the rollout rank keeps the cursor it has
        h.source.branch = 0
        h.bridge.notify_all(Notice(step=1, version=0, actor_version=0, weights=True,
                                   reset={"epoch": 0, "cursor": 0}))
        h.bridge.broadcast_weights(iter([("w", torch.tensor(0.0))]), 0)
        with pytest.raises(RuntimeError, match="sampler gives"):
            h.collect(1)
    finally:
        h.close()


@pytest.mark.parametrize("k,tp", [(0, 1), (2, 1), (2, 2)])
def test_rollout_ranks_validate_with_the_updated_weights_and_later_units_are_unchanged(k: int, tp: int) -> None:
    # Validation after steps 0 (before training) and 2, on 2 engines (at TP 2: 4 rollout ranks), chunks of 3 of
    # the 7 validation prompts; the training units are the same as in a run without validation.
    def run(validate: bool) -> tuple[list[list[list[int]]], list[Any]]:
        h = Harness(max_staleness=k, rollout_ranks=2 * tp, dp_size=1, total_steps=5, tensor_parallel_size=tp,
                    jitter_s=0.003)
        batches, vals = [], []

        def val(step: int) -> None:
            ctx = StepContext(step=step, branch=0, actor_version=h.actor_version, seed=0)
            vals.append(list(h.source.validation(ctx, VAL, Sampling(n=1), lambda c: 1000 * step + c, 3)))

        try:
            if validate:
                val(0)
            for step in range(1, 6):
                batches.append(h.collect(step).batch.response_ids.tolist())
                h.actor_version += 1
                if validate and step == 2:
                    val(2)
        finally:
            h.close()
        if tp > 1:
            for leader in (0, 2):  # the followers ran the same generate calls, validation included
                assert h.engines[leader].calls == h.engines[leader + 1].calls
        return batches, vals

    plain, _ = run(False)
    batches, vals = run(True)
    assert batches == plain
    for step, chunks in zip((0, 2), vals):
        assert [[p.index for p in prompts] for prompts, _ in chunks] == [[0, 1, 2], [3, 4, 5], [6]]
        for c, (prompts, got) in enumerate(chunks):
            assert weight_of(got.batch) == step  # the actor after step `step`'s update (version 0 before training)
            assert [int(x) for x in got.batch.response_ids[:, 1]] == [(1000 * step + c) % 89 + 1] * len(prompts)
            assert got.batch.prompt_ids[:, -2].tolist() == [50 + p.index for p in prompts]


def test_a_unit_survives_a_checkpoint() -> None:
    engine = StandInEngine()
    b = engine.generate([[1, 2]], Sampling(seed=3))
    stats = LoopStats(turns=2, tool_calls=1)
    stats.calls["mul"] += 1
    p = Produced(step=3, dp_rank=1, branch=2, version=4, indices=(1, 5), generated=Generated(
        batch=b, greedy=b, tool_stats=stats, tool_rewards=[[0.5]], tool_scores=[{"mul": 1.0}]), generate_s=0.25,
                 idle_s=0.5, worker=1)
    torch.save(unit_state(p), buf := io.BytesIO())
    buf.seek(0)
    back = unit_from_state(torch.load(buf, weights_only=True))
    assert back.indices == (1, 5) and back.generated.tool_stats == stats and back.generated.tool_scores == [{"mul": 1.0}]
    assert all(torch.equal(getattr(back.generated.batch, f), getattr(b, f)) for f in vars(b))
    assert (back.step, back.dp_rank, back.branch, back.version, back.worker) == (3, 1, 2, 4, 1)


def test_produced_is_picklable() -> None:
    import pickle

    engine = StandInEngine()
    b = engine.generate([[1, 2]], Sampling(seed=3))
    p = Produced(step=1, dp_rank=0, branch=0, version=0, indices=(1,), generated=Generated(
        batch=b, tool_stats=LoopStats(turns=2), tool_rewards=[[0.5]], tool_scores=[{"mul": 1.0}]), generate_s=0.0,
                 idle_s=0.0, worker=0)
    back = pickle.loads(pickle.dumps(p))  # a multi-turn unit's tool results and counts travel with it
    assert back.indices == (1,) and back.generated.tool_rewards == [[0.5]] and back.generated.tool_stats == LoopStats(
        turns=2)


def test_an_engines_ranks_share_one_world_on_a_port_of_the_engines_own() -> None:
    from hpcppo.train.rollout_rank import own_world

    env = {"HPCPPO_BRIDGE_PORT": "20000"}
    worlds = [own_world(env, i, 2) for i in range(6)]  # 6 rollout ranks at TP 2: engines 0, 1, 2
    assert [(w["RANK"], w["WORLD_SIZE"], w["MASTER_PORT"]) for w in worlds] == [
        ("0", "2", "20001"), ("1", "2", "20001"), ("0", "2", "20002"), ("1", "2", "20002"),
        ("0", "2", "20003"), ("1", "2", "20003")]
    assert all(w["MASTER_ADDR"] == "127.0.0.1" and "LOCAL_RANK" not in w for w in worlds)  # the task's GPU stays
    # one rank per engine: a world of one each, the ports one world per rollout rank always used
    assert [(w["RANK"], w["WORLD_SIZE"], w["MASTER_PORT"]) for w in (own_world(env, i) for i in range(3))] == [
        ("0", "1", "20001"), ("0", "1", "20002"), ("0", "1", "20003")]
