"""``hpcppo.distributed.expert_layout``: the in-memory weights of a transformers MoE, put back in the checkpoint's
layout, are exactly what ``save_pretrained`` writes (names, shapes, values: gate before up); conversions it cannot
invert are refused with the model type and the patterns."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dist"))

from _families import FAMILIES, build  # noqa: E402

from hpcppo.distributed.expert_layout import UnsupportedExpertLayout, checkpoint_layout, layout_for  # noqa: E402


@pytest.mark.parametrize("name", [n for n, f in FAMILIES.items() if f.moe] + ["llama"])
def test_the_checkpoint_layout_is_what_save_pretrained_writes(tmp_path, name):
    from safetensors.torch import load_file

    model = build(name)
    model.save_pretrained(tmp_path)
    on_disk = load_file(str(tmp_path / "model.safetensors"))
    layout = layout_for(model.config.model_type)
    streamed = dict(checkpoint_layout(((n, p.detach()) for n, p in model.named_parameters()), layout))
    assert streamed.keys() == on_disk.keys()
    for key, tensor in on_disk.items():
        assert torch.equal(streamed[key], tensor), key
    fused = [n for n, _ in model.named_parameters() if n.endswith("experts.gate_up_proj")]
    assert bool(fused) == FAMILIES[name].moe  # the MoE families do hold fused experts in memory
    if fused:
        assert "model.layers.0.mlp.experts.3.up_proj.weight" in on_disk


def test_a_conversion_it_cannot_invert_is_refused_by_name():
    with pytest.raises(UnsupportedExpertLayout, match=r"qwen3_vl_moe: transformers converts .*Transpose"):
        layout_for("qwen3_vl_moe")


def test_mixtral_names_go_back_to_block_sparse_moe():
    layout = layout_for("mixtral")
    t = torch.arange(2 * 6 * 3, dtype=torch.float32).reshape(2, 6, 3)
    out = dict(checkpoint_layout([("model.layers.0.mlp.experts.gate_up_proj", t),
                                  ("model.layers.0.mlp.gate.weight", t[0])], layout))
    assert list(out) == [f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight" for e in (0, 1)
                         for w in ("w1", "w3")] + ["model.layers.0.block_sparse_moe.gate.weight"]
    assert torch.equal(out["model.layers.0.block_sparse_moe.experts.1.w3.weight"], t[1, 3:])
