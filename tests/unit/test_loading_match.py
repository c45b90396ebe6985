"""Which checkpoint tensor fills which meta parameter (hpcppo.distributed.loading.match_checkpoint), and the old path
kept for directories that cannot be loaded shard by shard (hpcppo.train.build.load_sharded), in one process."""

from __future__ import annotations

import functools
import logging

import torch

from hpcppo import models
from hpcppo.distributed import loading
from hpcppo.train.build import load_sharded


def save_qwen2(directory, *, tied: bool = False, safe: bool = True, base: bool = False) -> None:
    from safetensors.torch import load_file
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Model

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=48, vocab_size=40, max_position_embeddings=32, tie_word_embeddings=tied)
    (Qwen2Model if base else Qwen2ForCausalLM)(cfg).save_pretrained(directory)
    if not safe:  # transformers 5 writes safetensors only: an older checkpoint's pytorch_model.bin by hand
        file = directory / "model.safetensors"
        torch.save(load_file(str(file)), directory / "pytorch_model.bin")
        file.unlink()


def test_keys_for_actor_critic_and_tied_weights(tmp_path):
    save_qwen2(tmp_path, tied=True)
    actor = models.build_actor(tmp_path, empty=True)
    keys, missing = loading.match_checkpoint(actor, tmp_path)
    assert missing == [] and "lm_head.weight" not in keys  # tied: filled once, through the embedding
    assert keys["model.embed_tokens.weight"] == "model.embed_tokens.weight"
    critic = models.build_critic(tmp_path, empty=True)
    keys, missing = loading.match_checkpoint(critic, tmp_path, strip="backbone.")
    assert missing == [] and keys["backbone.norm.weight"] == "model.norm.weight"  # the base model's prefix added
    assert not any(k.startswith("value_head") for k in keys)  # real already: seeded, not read


def test_a_base_model_checkpoint_lacks_the_lm_head(tmp_path):
    save_qwen2(tmp_path, base=True)
    critic = models.build_critic(tmp_path, empty=True)
    keys, missing = loading.match_checkpoint(critic, tmp_path, strip="backbone.")
    assert missing == [] and keys["backbone.norm.weight"] == "norm.weight"
    keys, missing = loading.match_checkpoint(models.build_actor(tmp_path, empty=True), tmp_path)
    assert missing == ["lm_head.weight"]  # from_pretrained would initialise it at random: not our path


def test_without_safetensors_and_a_process_group_the_whole_model_loads_as_before(tmp_path, caplog):
    save_qwen2(tmp_path, safe=False)
    assert not (tmp_path / "model.safetensors").exists() and loading.checkpoint_tensors(tmp_path) == {}
    with caplog.at_level(logging.WARNING, logger="hpcppo.train"):
        model = load_sharded(functools.partial(models.build_actor, str(tmp_path)), str(tmp_path),
                             torch.device("cpu"), lambda m: m)
    assert "the whole model is loaded" in caplog.text
    want = models.build_actor(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(want.state_dict().values(), model.state_dict().values()))
    assert not any(p.is_meta for p in model.parameters())


def test_one_rank_unsharded_load_equals_from_pretrained(tmp_path):
    save_qwen2(tmp_path)
    model = load_sharded(functools.partial(models.build_actor, str(tmp_path)), str(tmp_path), torch.device("cpu"),
                         lambda m: m)
    want = models.build_actor(tmp_path)
    assert want.state_dict().keys() == model.state_dict().keys()
    for (name, a), b in zip(want.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    for (name, a), b in zip(want.named_buffers(), model.buffers()):
        assert torch.equal(a, b), name
