"""The colocated rollout source (docs/rollout-phase.md): wake, sync the actor's weights only when the engine's are
stale, run the agent loop with the step's seed (and ReMax's greedy decode), sleep; the batch stamped with the
version its weights came from."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from hpcppo.rollout.agent_loop import SingleTurnLoop
from hpcppo.rollout.base import SamplingParams, batch_from_lists
from hpcppo.rollout.source import ColocatedSource, StepContext


class Engine:
    """Records the calls the source makes; answers each prompt with ``[prompt's first token, EOS]``."""

    def __init__(self, weights_dropped: bool = False):
        self.calls: list[tuple] = []
        self.weights_dropped = weights_dropped
        self.sync_dtype, self.sync_targets = torch.bfloat16, None

    def wake_up(self):
        self.calls.append(("wake_up",))

    def sleep(self):
        self.calls.append(("sleep",))

    def sync_weights(self, stream):
        self.calls.append(("sync", [name for name, _ in stream]))
        return 0

    def generate(self, prompts, sampling):
        self.calls.append(("generate", sampling.n, sampling.temperature, sampling.seed))
        responses = [[p[0], 2] for p in prompts for _ in range(sampling.n)]
        return batch_from_lists(prompts, responses, [[-1.0, -1.0]] * len(responses), n=sampling.n,
                                eos_token_ids=[2], pad_token_id=0)


def source(engine: Engine, greedy: bool = False) -> tuple[ColocatedSource, list]:
    asked: list = []

    def weights(**kwargs):
        asked.append(kwargs)
        return iter([("w", torch.zeros(1))])

    prompts = [SimpleNamespace(input_ids=[5, 6]), SimpleNamespace(input_ids=[7])]
    sampling = SamplingParams(eos_token_id=2, pad_token_id=0, n=2, temperature=0.7, top_k=5, seed=1)
    return ColocatedSource(engine, SingleTurnLoop(engine), weights=weights, prompts=lambda: prompts,
                           sampling=sampling, greedy_baseline=greedy), asked


def test_the_source_syncs_stale_weights_only_and_stamps_their_version():
    engine = Engine()
    src, asked = source(engine)
    got = src.collect(StepContext(step=1, branch=0, actor_version=0, seed=11))
    assert engine.calls == [("wake_up",), ("sync", ["w"]), ("generate", 2, 0.7, 11), ("sleep",)]
    assert asked == [{"dtype": torch.bfloat16, "into": None}]  # the engine's dtype and targets
    assert got.batch.policy_version.tolist() == [[0, 0]] * 4 and got.greedy is None
    assert [p.input_ids for p in got.prompts] == [[5, 6], [7]] and set(got.times) == {"weight_sync", "generate"}
    engine.calls.clear()
    src.collect(StepContext(step=2, branch=0, actor_version=0, seed=12))  # critic warm-up: the actor unchanged
    assert [c[0] for c in engine.calls] == ["wake_up", "generate", "sleep"]
    engine.calls.clear()
    got = src.collect(StepContext(step=3, branch=1, actor_version=4, seed=13))
    assert [c[0] for c in engine.calls] == ["wake_up", "sync", "generate", "sleep"]
    assert (got.batch.policy_version == 4).all()
    # validation: awake, weights current (no second sync), this rank's every 2nd prompt in chunks of 2 with its
    # group's seed
    val = [SimpleNamespace(input_ids=[20 + i]) for i in range(5)]
    src.shard = (1, 2)
    chunks = list(src.validation(StepContext(step=3, branch=1, actor_version=4, seed=0), val,
                                 SamplingParams(eos_token_id=2, pad_token_id=0), lambda shard: 100 + shard, 2))
    assert [c[0] for c in engine.calls][4:] == ["wake_up", "generate", "sleep"]
    assert engine.calls[5][3] == 101  # rollout group 1's seed
    assert [[p.input_ids for p in prompts] for prompts, _ in chunks] == [[[21], [23]]]
    assert chunks[0][1].batch.response_ids[:, 0].tolist() == [21, 23]


def test_an_engine_that_drops_its_weights_is_synced_every_step_and_remax_decodes_greedily():
    engine = Engine(weights_dropped=True)
    src, _ = source(engine, greedy=True)
    for step in (1, 2):
        got = src.collect(StepContext(step=step, branch=0, actor_version=0, seed=20 + step))
    assert [c[0] for c in engine.calls].count("sync") == 2
    assert engine.calls[-3:] == [("generate", 2, 0.7, 22), ("generate", 1, 0.0, 22), ("sleep",)]
    assert got.greedy is not None and got.greedy.num_samples == 2  # one per prompt
