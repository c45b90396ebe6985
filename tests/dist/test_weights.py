"""Weight streaming helpers on plain (unsharded) modules, single process: names, shapes, buffers, errors.

The FSDP side (full_tensor() gathers on 2 and 4 gloo ranks) is in test_fsdp.py.
"""

from __future__ import annotations

import pytest
import torch
from _models import PlainStack

from hpcppo.distributed.fsdp import apply_activation_checkpointing, find_layers
from hpcppo.distributed.weights import clean_name, iter_full_params, load_into


class WithBuffers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.norm = torch.nn.BatchNorm1d(2)  # persistent running stats
        self.register_buffer("scratch", torch.zeros(2), persistent=False)


def test_clean_name_strips_wrappers():
    assert clean_name("model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight") == \
        "model.layers.0.mlp.up_proj.weight"
    assert clean_name("_orig_mod.lm_head.weight") == "lm_head.weight"
    assert clean_name("model.norm.weight") == "model.norm.weight"


def test_plain_module_round_trip_with_buffers():
    src, dst = WithBuffers(), WithBuffers()
    src.norm.running_mean.fill_(3.0)
    names = [n for n, _ in iter_full_params(src, include_buffers=True)]
    assert names == ["lin.weight", "lin.bias", "norm.weight", "norm.bias", "norm.running_mean", "norm.running_var",
                     "norm.num_batches_tracked"]  # the non-persistent buffer is not part of the weights
    load_into(dst, iter_full_params(src, include_buffers=True))
    assert torch.equal(dst.lin.weight, src.lin.weight) and torch.equal(dst.norm.running_mean, src.norm.running_mean)


def test_checkpoint_wrapped_source_loads_into_plain_target():
    src = PlainStack(seed=1)
    apply_activation_checkpointing(src)
    assert any("_checkpoint_wrapped_module" in n for n, _ in src.named_parameters())
    dst = PlainStack(seed=2)
    load_into(dst, iter_full_params(src))
    ids = torch.arange(8).view(2, 4)
    assert torch.equal(dst(ids), PlainStack(seed=1)(ids))


def test_dtype_cast_into_bf16_target():
    src, dst = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2).to(torch.bfloat16)
    load_into(dst, iter_full_params(src, dtype=torch.bfloat16))
    assert dst.weight.dtype == torch.bfloat16 and torch.equal(dst.weight, src.weight.to(torch.bfloat16))


def test_load_into_errors():
    src = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"shape mismatch for 'weight': module has \(4, 3\), source has \(2, 3\)"):
        load_into(torch.nn.Linear(3, 4), iter_full_params(src))
    with pytest.raises(KeyError, match="no parameter or buffer named 'extra.weight'"):
        load_into(src, [("extra.weight", torch.zeros(1))])
    with pytest.raises(KeyError, match=r"1 parameters were not in the source: \['bias'\]"):
        load_into(src, [("weight", torch.zeros(2, 3))])
    assert load_into(src, [("weight", torch.zeros(2, 3))], strict=False) == ["weight"]


def test_find_layers_discovery_and_error():
    stack = PlainStack()
    assert find_layers(stack) == list(stack.blocks)
    assert find_layers(stack, (torch.nn.Linear,))[0] is stack.blocks[0][0]
    with pytest.raises(ValueError, match="no decoder layers found in Linear: pass layer_classes"):
        find_layers(torch.nn.Linear(2, 2))
