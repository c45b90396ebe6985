"""Loading without a full copy per rank (issue 21): on 2 real gloo ranks, the shards that each rank reads from the
safetensors files (hpcppo.train.build.load_sharded -> hpcppo.distributed.loading) equal, bit for bit, the shards of
the old path (the whole model from_pretrained on every rank, then fully_shard), for actor, reference and critic,
tied and untied embeddings, uneven shards, a bfloat16 checkpoint cast to float32, and split (indexed) files; a
pytorch_model.bin is loaded whole by rank 0 alone and broadcast, with the same shards."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _spawn import run_distributed


def _save(directory: str, *, tied: bool, dtype: torch.dtype, shard_size: str | None) -> None:
    """A tiny Qwen2 in ``directory``: one safetensors file, split ones (``shard_size``), or ``"bin"``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    # Odd vocabulary and intermediate sizes: uneven dim-0 shards on 2 ranks (FSDP2 pads the last one).
    cfg = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=97, vocab_size=67, max_position_embeddings=64, tie_word_embeddings=tied)
    kwargs = {"max_shard_size": shard_size} if shard_size and shard_size != "bin" else {}
    Qwen2ForCausalLM(cfg).to(dtype).save_pretrained(directory, **kwargs)
    if shard_size == "bin":  # an older checkpoint: pytorch_model.bin (transformers 5 writes safetensors only)
        from safetensors.torch import load_file

        file = Path(directory) / "model.safetensors"
        torch.save(load_file(str(file)), Path(directory) / "pytorch_model.bin")
        file.unlink()


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.to_local() if isinstance(t, DTensor) else t).detach().clone()


def _counting(build, counts: dict):
    """``build`` that counts whole builds (not ``empty=True`` ones)."""

    def wrapped(*args, **kwargs):
        if not kwargs.get("empty"):
            counts["whole"] = counts.get("whole", 0) + 1
        return build(*args, **kwargs)

    return wrapped


def _both_paths(rank: int, world_size: int, directory: str, nodes: int = 1, offload: bool = False) -> dict:
    import functools

    from hpcppo import models
    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.train.build import load_sharded

    mesh = build_mesh("cpu", world_size, nodes, hsdp=nodes > 1)
    ids = torch.randint(0, 67, (2, 9), generator=torch.Generator().manual_seed(5))
    out = {}
    for kind, build, frozen, strip in (("actor", models.build_actor, False, ""),
                                       ("reference", models.build_reference, True, ""),
                                       ("critic", models.build_critic, False, "backbone.")):
        def shard(m, frozen=frozen):
            return apply_fsdp(m, mesh, param_dtype=None, reduce_dtype=None, cpu_offload=offload,
                              reshard_after_forward=True if frozen else False)

        models_ = {}
        torch.manual_seed(11)
        models_["old"] = shard(build(directory).to("cpu"))
        rng_old = torch.get_rng_state()
        torch.manual_seed(11)
        counts: dict = {}
        models_["new"] = load_sharded(functools.partial(_counting(build, counts), directory), directory,
                                      torch.device("cpu"), shard, offload=offload, strip=strip)
        rng_new = torch.get_rng_state()
        out[(kind, "whole builds")] = counts.get("whole", 0)
        for path, model in models_.items():
            shards = {n: _local(p) for n, p in model.named_parameters(remove_duplicate=False)}  # before a forward
            with torch.no_grad():
                result = model(input_ids=ids)
            out[(kind, path)] = {
                "params": shards,
                "buffers": {n: _local(b) for n, b in model.named_buffers()},
                "output": (result if isinstance(result, torch.Tensor) else result.logits).clone(),
                "tied": (model.lm_head.weight is model.model.embed_tokens.weight) if kind != "critic" else None,
            }
        out[(kind, "rng")] = torch.equal(rng_old, rng_new)
    return out


@pytest.mark.parametrize("tied,dtype,shard_size", [(False, torch.float32, None), (True, torch.bfloat16, "40KB"),
                                                    (False, torch.bfloat16, "bin")])
def test_each_rank_reads_the_shards_of_the_old_path_bit_for_bit(tmp_path, tied, dtype, shard_size):
    _save(str(tmp_path), tied=tied, dtype=dtype, shard_size=shard_size)
    if shard_size == "40KB":
        assert (tmp_path / "model.safetensors.index.json").is_file()
    results = run_distributed(_both_paths, 2, str(tmp_path))
    # Only a checkpoint without safetensors makes a whole model, on rank 0 alone (then broadcast).
    for rank, result in enumerate(results):
        for kind in ("actor", "reference", "critic"):
            assert result[(kind, "whole builds")] == (1 if shard_size == "bin" and rank == 0 else 0), (rank, kind)
    for rank, result in enumerate(results):
        for kind in ("actor", "reference", "critic"):
            old, new = result[(kind, "old")], result[(kind, "new")]
            assert old["params"].keys() == new["params"].keys() and old["params"]
            for name in old["params"]:
                a, b = old["params"][name], new["params"][name]
                assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape and torch.equal(a, b), (rank, kind,
                                                                                                          name)
            assert old["buffers"].keys() == new["buffers"].keys() and old["buffers"]  # rotary inv_freq
            for name in old["buffers"]:
                assert torch.equal(old["buffers"][name], new["buffers"][name]), (rank, kind, name)
            assert torch.equal(old["output"], new["output"]), (rank, kind)
            assert old["tied"] == new["tied"] == (tied if kind != "critic" else None)
            assert result[(kind, "rng")]  # the global generator is where the old path left it
    # the shards differ between the ranks: each read its own rows
    emb = "model.embed_tokens.weight"
    assert results[0][("actor", "new")]["params"][emb].shape[0] == 34
    assert results[1][("actor", "new")]["params"][emb].shape[0] == 33


def test_hsdp_replicas_and_offloaded_shards_read_the_same_rows_as_the_old_path(tmp_path):
    """4 ranks as 2 nodes x 2 (HSDP: Replicate across nodes, Shard(0) within one) with FSDP2's CPU offload."""
    _save(str(tmp_path), tied=False, dtype=torch.bfloat16, shard_size=None)
    results = run_distributed(_both_paths, 4, str(tmp_path), 2, True)
    for rank, result in enumerate(results):
        for kind in ("actor", "reference", "critic"):
            old, new = result[(kind, "old")], result[(kind, "new")]
            for name in old["params"]:
                assert torch.equal(old["params"][name], new["params"][name]), (rank, kind, name)
            assert torch.equal(old["output"], new["output"]), (rank, kind)
    emb = "model.embed_tokens.weight"
    rows = [r[("actor", "new")]["params"][emb] for r in results]
    assert [t.shape[0] for t in rows] == [34, 33, 34, 33]  # ranks 0, 2 (and 1, 3) hold the same rows
    assert torch.equal(rows[0], rows[2]) and torch.equal(rows[1], rows[3]) and not torch.equal(rows[0][:33], rows[1])
