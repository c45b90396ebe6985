"""Rollout with tensor_parallel_size = 2 on 4 real gloo ranks, through the trainer's own rollout and validation.

vLLM builds its TP groups from consecutive ranks ([0, 1], [2, 3]); the ranks of a group must submit identical
prompts and seeds, the groups different ones, and after generation each rank must train on a distinct share.
The engine is ``VLLMRolloutEngine`` over ``tests/_fakes/recording_vllm`` — a recording stand-in, NOT vLLM: this
test shows what each rank asks the engine for and what it trains on, never that vLLM generates correctly.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from _spawn import run_distributed

FAKES = str(Path(__file__).resolve().parents[1] / "_fakes")
PROMPTS, VAL = 64, 10


class _Tokenizer:
    def batch_decode(self, ids, skip_special_tokens=True):  # noqa: ARG002
        return [" ".join(map(str, row.tolist())) for row in ids]


def _worker(rank: int, world: int, tp: int) -> dict:
    sys.path.insert(0, FAKES)
    import recording_vllm

    recording_vllm.install()
    recording_vllm.reset()
    import hpcppo.rollout.vllm_engine as vllm_engine
    from hpcppo.config.multi_turn import MultiTurnSection
    from hpcppo.config.reward import RewardManagerSection
    from hpcppo.distributed.env import detect_env
    from hpcppo.rollout import SamplingParams
    from hpcppo.train.build import build_sampler
    from hpcppo.train.rollout_phase import colocated_source
    from hpcppo.train.trainer import PhaseTimer, Trainer
    from hpcppo.watchdog import TrainingState

    vllm_engine._empty_cache = lambda: None
    env = detect_env(os.environ, device_type="cpu")
    plan = SimpleNamespace(placement="colocated", tensor_parallel_size=tp, dp_size=world // tp, prompts_per_step=8)
    sampler, groups = build_sampler(PROMPTS, plan, env, seed=3, shuffle=True)

    def item(i: int, source: str):
        record = SimpleNamespace(data_source=source, ground_truth=str(i), extra_info={})
        return SimpleNamespace(index=i, input_ids=[10 + i % 40, 3 + i % 7, 5], record=record)

    torch.manual_seed(0)
    c = SimpleNamespace(
        engine=vllm_engine.VLLMRolloutEngine("/models/m", tensor_parallel_size=tp, dist_env=env),
        sampler=sampler, groups=groups, device=torch.device("cpu"), tokenizer=_Tokenizer(),
        train_data=[item(i, "arith") for i in range(PROMPTS)], val_data=[item(i, "arith") for i in range(VAL)],
        val_sources=["arith"], tools=None,  # single turn: no tool loop
        actor=SimpleNamespace(model=torch.nn.Sequential(torch.nn.Embedding(64, 8), torch.nn.Linear(8, 64))),
        sampling=SamplingParams(eos_token_id=(2,), pad_token_id=0, n=2, max_new_tokens=6),
        val_sampling=SamplingParams(eos_token_id=(2,), pad_token_id=0, n=1, temperature=0.0, max_new_tokens=4),
        # the score of a validation prompt is its index: each prompt counted once gives the mean of 0..VAL-1
        score_fn=lambda sources, texts, truths, extras, preds=None, lengths=None, penalties=None: [
            float(t) for t in truths],
        reward_model=None,  # rule-based validation
        cfg=SimpleNamespace(rollout=SimpleNamespace(multi_turn=MultiTurnSection())),  # single turn: agent_loop's pick
    )
    trainer = Trainer.__new__(Trainer)  # only the phases under test: rollout and validate
    trainer.c, trainer.cfg, trainer.env = c, SimpleNamespace(seed=5, reward_manager=RewardManagerSection()), env
    trainer.state, trainer.timer = TrainingState(step=1, kl_coef=0.0), PhaseTimer()
    trainer.source = colocated_source(c, greedy_baseline=False)  # the engine's weights: version -1, stale
    batch = trainer.rollout()
    val = trainer.validate()
    calls = recording_vllm.CALLS
    return {
        "groups": (groups.dp_rank, groups.tp_rank),
        "env_at_init": calls[0][2],
        "generate": [(rows, seeds) for name, rows, seeds, _ in (x for x in calls if x[0] == "generate")],
        "rows": list(zip(batch["prompt_index"].tolist(), batch["responses"].tolist())),
        "val": val,
    }


def test_tp2_groups_share_prompts_and_seeds_and_split_the_batch():
    out = run_distributed(_worker, 4, 2)
    assert [o["groups"] for o in out] == [(0, 0), (0, 1), (1, 0), (1, 1)]  # consecutive ranks, as vLLM groups them
    assert [o["env_at_init"]["RANK"] for o in out] == ["0", "1", "2", "3"]
    for k in (0, 1):
        a, b = out[2 * k], out[2 * k + 1]
        assert a["generate"] == b["generate"]  # rollout and validation: same prompts, same seeds in a group
    g0, g1 = out[0]["generate"], out[2]["generate"]
    assert len(g0) == len(g1) == 2  # one rollout, one validation batch
    (roll0, seeds0), (roll1, seeds1) = g0[0], g1[0]
    assert len(roll0) == len(roll1) == 4  # 8 prompts per step over 2 groups
    assert roll0 != roll1
    assert set(seeds0).isdisjoint(seeds1)
    assert g0[1][0] != g1[1][0]  # validation prompts differ across groups too
    # each rank trains on its half of its group's rows: 4 prompts x n=2 = 8 rows, 4 per rank, all distinct
    shares = [o["rows"] for o in out]
    assert all(len(s) == 4 for s in shares)
    for k in (0, 1):
        assert shares[2 * k] != shares[2 * k + 1]
        group_prompts = {i for i, _ in shares[2 * k] + shares[2 * k + 1]}
        assert len(group_prompts) == 4
    assert {i for i, _ in shares[0] + shares[1]}.isdisjoint({i for i, _ in shares[2] + shares[3]})
    # validation counts each prompt once (only the first rank of a group reports), the same on every rank
    expected = sum(range(VAL)) / VAL
    assert [o["val"]["val/score"] for o in out] == [expected] * 4
