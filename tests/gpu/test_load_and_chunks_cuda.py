"""Issue 21 on a GPU (1-rank NCCL group, FSDP2 with bf16 compute so that fully_shard runs even on one rank):

* loading without a full copy: ``train.build.load_sharded`` onto ``cuda`` (and with FSDP2's CPU offload, shards on
  the host) gives the shards of the old path (``from_pretrained`` float32, ``.to(cuda)``, shard) bit for bit, buffers
  stay on the GPU (rotary ``inv_freq``), and the forwards are equal;
* log-probs in chunks: ``models.forward_log_probs`` with small chunks against one chunk (the whole logits) on the
  bf16 FSDP2 model: log-probs and the gradients of a loss with an entropy bonus.

The measurements run in a child process (``python tests/gpu/test_load_and_chunks_cuda.py load OUT_DIR``) and the tests
judge its ``result-0.pt``. ``HPCPPO_GPU_SCENARIO_DEVICE=cpu`` runs the scenario on gloo/CPU (to check this file
without a GPU; the tests never set it).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from _gpu_launch import cuda_device_count, run_scenario, scenario_main


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict[str, Any]:
    cuda_device_count()
    (r,) = run_scenario("load", 1, tmp_path_factory.mktemp("load"), timeout_s=180, script=Path(__file__).resolve())
    return r


@pytest.mark.parametrize("offload", [False, True], ids=["on-gpu", "cpu-offload"])
def test_sharded_load_onto_the_gpu_equals_the_old_path(result, offload):
    r = result["load"][offload]
    assert r["unequal"] == [], r["unequal"]
    assert r["param_devices"] == (["cpu"] if offload else ["cuda"]), r["param_devices"]
    assert r["buffer_devices"] == ["cuda"], r["buffer_devices"]
    assert r["output_equal"], "forward of the loaded model differs from the old path's"


def test_chunked_log_probs_on_the_gpu_equal_the_whole_logits(result):
    c = result["chunks"]
    assert c["chunks"] > 1
    assert c["log_prob_max_diff"] < 1e-5, c  # float32 reductions over the same bf16 logits
    # bf16 gradients: the LM head's is the sum of the chunks' bf16 gradients (one rounding per chunk) instead of one
    # matmul's; against float32 the chunked path's error stays of the order of the whole path's own.
    assert c["grad_max_rel_diff"] < 3e-2, c
    assert c["chunked_vs_float32"] < 2 * c["whole_vs_float32"] + 1e-2, c


def _model_dir(directory: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(3)
    cfg = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=97, vocab_size=67, max_position_embeddings=64)
    Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(directory)


def _load_case(mesh: Any, device: Any, directory: str, *, offload: bool) -> dict[str, Any]:
    import functools

    import torch
    from torch.distributed.tensor import DTensor

    from hpcppo import models
    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.train.build import load_sharded

    def shard(m: Any) -> Any:
        return apply_fsdp(m, mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cpu_offload=offload,
                          reshard_after_forward=True)

    old = shard(models.build_actor(directory).to(device))
    new = load_sharded(functools.partial(models.build_actor, directory), directory, device, shard, offload=offload)

    def local(t: Any) -> Any:
        return t.to_local() if isinstance(t, DTensor) else t

    unequal = [n for (n, a), b in zip(old.named_parameters(), new.parameters())
               if not torch.equal(local(a).cpu(), local(b).cpu())]
    ids = torch.randint(0, 67, (2, 9), generator=torch.Generator().manual_seed(5)).to(device)
    with torch.no_grad():
        same = torch.equal(old(input_ids=ids).logits, new(input_ids=ids).logits)
    return {"unequal": unequal, "output_equal": same,
            "param_devices": sorted({local(p).device.type for p in new.parameters()}),
            "buffer_devices": sorted({b.device.type for b in new.buffers()})}


def _chunks_case(mesh: Any, device: Any, directory: str) -> dict[str, Any]:
    import functools

    import torch

    from hpcppo import models
    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.train.build import load_sharded

    def shard(m: Any, dtype: Any = torch.bfloat16) -> Any:
        return apply_fsdp(m, mesh, param_dtype=dtype, reduce_dtype=torch.float32, cpu_offload=False,
                          reshard_after_forward=True)

    ids = torch.randint(0, 67, (3, 20), generator=torch.Generator().manual_seed(7)).to(device)
    mask, pos = torch.ones_like(ids), torch.arange(20, device=device).expand(3, -1)
    out = {}
    for name, chunk, dtype in (("whole", 1 << 40, torch.bfloat16), ("chunked", 3 * 2 * 67, torch.bfloat16),
                               ("float32", 1 << 40, torch.float32)):
        model = load_sharded(functools.partial(models.build_actor, directory), directory, device,
                             functools.partial(shard, dtype=dtype))
        lp, ent = models.forward_log_probs(model, ids, mask, pos, 12, temperature=0.8, with_entropy=True,
                                           chunk_elements=chunk)
        (lp.sum() - 0.1 * ent.sum()).backward()
        out[name] = (lp.detach().float().cpu(), {n: p.grad.full_tensor().float().cpu()
                                                 for n, p in model.named_parameters()})
    (lw, gw), (lc, gc), (_, g32) = out["whole"], out["chunked"], out["float32"]

    def rel(a: dict, b: dict) -> float:
        return max(((a[n] - b[n]).abs().max() / b[n].abs().max().clamp_min(1e-12)).item() for n in b)

    return {"chunks": 12 // 2, "log_prob_max_diff": (lw - lc).abs().max().item(), "grad_max_rel_diff": rel(gc, gw),
            "whole_vs_float32": rel(gw, g32), "chunked_vs_float32": rel(gc, g32)}


def scenario_load(out_dir: Path) -> dict[str, Any]:
    import torch

    from hpcppo.distributed.env import detect_env, init_distributed
    from hpcppo.distributed.mesh import build_mesh

    env = detect_env(os.environ, device_type=os.environ.get("HPCPPO_GPU_SCENARIO_DEVICE", "cuda"))
    init_distributed(env, timeout_s=120)
    device = torch.device("cuda", env.local_rank) if env.device_type == "cuda" else torch.device("cpu")
    mesh = build_mesh(env.device_type, env.world_size, 1, hsdp=False)
    with tempfile.TemporaryDirectory() as directory:
        _model_dir(Path(directory))
        return {"load": {offload: _load_case(mesh, device, directory, offload=offload) for offload in (False, True)},
                "chunks": _chunks_case(mesh, device, directory)}


if __name__ == "__main__":
    sys.exit(scenario_main(sys.argv[1:], "load", scenario_load))
