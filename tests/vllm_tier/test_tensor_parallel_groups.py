"""Two real vLLM engines of ``rollout.tensor_parallel_size = 2`` in one world of 4 gloo ranks (vLLM's CPU backend,
external launcher), through the trainer's own rollout phase: what the 7B example does with 8 engines of TP 2 in 16
ranks. Each group gets its own prompts (the sampler shards by ``rank // 2``) and both ranks of a group receive the
same rows; the KV cache is sized alike across the whole world (vLLM's ``ExecutorWithExternalLauncher.
determine_available_memory`` takes the minimum over the world group), although each rank asks for another size.

Marked ``slow`` and ``manual`` (outside CI: tools/test.sh deselects it): four engines start on the 2-core machine,
331 s there under load. Run it with ``.venv-vllm/bin/python -m pytest -m "vllm and manual" tests/vllm_tier``.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _engines import KV_CACHE_BYTES, greedy, rows, vllm_engine
from _spawn import run_distributed

pytestmark = [pytest.mark.slow, pytest.mark.manual]

KV_STEP = 16 * 2**20  # rank r asks for KV_CACHE_BYTES + r x KV_STEP


def _worker(rank: int, world: int, model_dir: str, data_dir: str) -> dict:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from hpcppo.data.dataset import PromptDataset, read_prompts
    from hpcppo.distributed.env import detect_env
    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.train.build import build_sampler
    from hpcppo.train.rollout_phase import colocated_source
    from hpcppo.train.trainer import PhaseTimer, Trainer
    from hpcppo.watchdog import TrainingState

    env = detect_env(os.environ, device_type="cpu")
    mesh = build_mesh("cpu", world, 1, hsdp=False)
    actor = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    apply_fsdp(actor, mesh, param_dtype=None, reduce_dtype=None, cpu_offload=False, reshard_after_forward=True)
    engine = vllm_engine(Path(model_dir), tensor_parallel_size=2, dist_env=env,
                         kv_cache_memory_bytes=KV_CACHE_BYTES + rank * KV_STEP)
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    data = PromptDataset(read_prompts([str(Path(data_dir) / "train.parquet")]), tok, max_prompt_length=48)
    plan = SimpleNamespace(placement="colocated", tensor_parallel_size=2, dp_size=world // 2, prompts_per_step=8)
    sampler, groups = build_sampler(len(data), plan, env, seed=3, shuffle=True)
    one_turn = SimpleNamespace(rollout=SimpleNamespace(multi_turn=SimpleNamespace(enable=False)))  # agent_loop
    c = SimpleNamespace(cfg=one_turn, engine=engine, sampler=sampler, groups=groups, device=torch.device("cpu"),
                        actor=SimpleNamespace(model=actor),  # the trainer streams c.actor.model (a ModelSet's)
                        train_data=data, sampling=greedy(n=2, temperature=1.0))
    trainer = Trainer.__new__(Trainer)  # the rollout phase only, as the trainer runs it
    trainer.c, trainer.cfg, trainer.env = c, SimpleNamespace(seed=5), env
    trainer.state, trainer.timer = TrainingState(step=1, kl_coef=0.0), PhaseTimer()
    trainer.source = colocated_source(c, greedy_baseline=False)  # the engine's weights: version -1, stale
    share = trainer.rollout()  # sync, generate this group's prompts with the step's seed, this rank's half
    cache = engine.llm.llm_engine.vllm_config.cache_config
    return {
        "groups": (groups.dp_rank, groups.tp_rank, groups.tp_size),
        "share": share["responses"].tolist(),
        "group_rows": rows(engine.generate([[5, 6, 7], [8, 9]], greedy(n=2, temperature=1.0, seed=11))),
        "kv_blocks": cache.num_gpu_blocks,
        "kv_asked": KV_CACHE_BYTES + rank * KV_STEP,
    }


def test_two_tensor_parallel_engines_in_a_world_of_four(warm_tiny):
    root, _ = warm_tiny
    r = run_distributed(_worker, 4, str(root / "model"), str(root / "data"))
    assert [x["groups"] for x in r] == [(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]
    # the KV cache agreed across the world: every engine has the blocks of the smallest request
    assert len({x["kv_blocks"] for x in r}) == 1 and r[0]["kv_blocks"] > 0, [x["kv_blocks"] for x in r]
    # within a group: the same rows for the same prompts and seed; the two halves of the step differ
    assert r[0]["group_rows"] == r[1]["group_rows"] and r[2]["group_rows"] == r[3]["group_rows"]
    assert r[0]["share"] != r[1]["share"] and r[2]["share"] != r[3]["share"]
    # across groups: other prompts (the sampler shards by rank // 2)
    assert r[0]["share"] != r[2]["share"]
