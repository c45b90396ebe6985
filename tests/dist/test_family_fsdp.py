"""Every family of issue 37's matrix (tests/dist/_families.py) through the trainer's loading and FSDP2, on real gloo
ranks: the meta-device loader (``hpcppo.train.build.load_sharded`` -> ``hpcppo.distributed.loading``) fills every
parameter, fused mixture-of-experts parameters included (the checkpoint's per-expert tensors -> transformers'
fused [experts, ...] parameters), with exactly what ``from_pretrained`` gives, without falling back to a whole
model; and the first steps' losses (a forward, AdamW step, forward) on 2 ranks equal those on 1 rank.

One spawn per world size runs every family (the forkserver's imports are paid once)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from _families import FAMILIES, save
from _spawn import run_distributed


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.to_local() if isinstance(t, DTensor) else t).detach().clone()


def _one_family(name: str, root: str, world: int) -> dict:
    from transformers import AutoModelForCausalLM

    from hpcppo import models
    from hpcppo.distributed import loading
    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.train.build import load_sharded

    family = FAMILIES[name]
    directory = str(Path(root) / name)
    build = functools.partial(models.build_actor, directory, attn_implementation=family.attn)
    _, missing = loading.match_checkpoint(build(empty=True), directory)
    mesh = build_mesh("cpu", world, 1, hsdp=False)
    actor = load_sharded(build, directory, torch.device("cpu"),
                         lambda m: apply_fsdp(m, mesh, param_dtype=None, reduce_dtype=None, cpu_offload=False,
                                              reshard_after_forward=True))
    shards = {n: _local(p) for n, p in actor.named_parameters()}  # before any forward
    whole = dict(AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).named_parameters())
    ids = torch.randint(4, 64, (4, 12), generator=torch.Generator().manual_seed(7))
    opt = torch.optim.AdamW(actor.parameters(), lr=1e-2)
    losses = []
    for _ in range(2):
        loss = actor(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return {"missing": missing, "shards": shards, "whole": {n: p.detach().clone() for n, p in whole.items()},
            "losses": losses}


def _families(rank: int, world: int, root: str) -> dict:
    torch.manual_seed(0)
    return {name: _one_family(name, root, world) for name in FAMILIES}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    for name in FAMILIES:
        save(name, root / name)
    return {world: run_distributed(_families, world, str(root)) for world in (1, 2)}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_meta_device_loader_fills_every_parameter_as_from_pretrained(runs, name):
    for world, results in runs.items():
        for rank, result in enumerate(results):
            r = result[name]
            assert r["missing"] == [], f"{name}: loading falls back to a whole model for {r['missing'][:3]}"
            assert r["shards"].keys() == r["whole"].keys()
            for param, local in r["shards"].items():
                full = r["whole"][param]
                rows = -(-full.shape[0] // world) if full.dim() else 0  # torch.chunk's split (FSDP2's Shard(0))
                expected = full[rank * rows:(rank + 1) * rows] if full.dim() else full
                assert torch.equal(local, expected), (name, world, rank, param)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_fsdp2_on_two_ranks_gives_the_first_losses_of_one_rank(runs, name):
    one = runs[1][0][name]["losses"]
    for result in runs[2]:
        assert result[name]["losses"] == pytest.approx(one, rel=1e-5, abs=1e-6), name
    assert one[1] != one[0]  # the step moved the weights
