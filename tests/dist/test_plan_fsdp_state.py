"""The planner's per-parameter bytes are what the trainer really allocates: the actor built as hpcppo builds it
(float32 load, ``_sharded`` with a bf16 compute dtype over a 2-rank gloo mesh, ``build_optimizer``), measured after one
forward/backward and one AdamW step, against ``hpcppo.sizing``'s numbers. Also checks the parameter count formula
against a real transformers Qwen2 model."""

from __future__ import annotations

import torch
from _models import batch, lm_loss, tiny_lm
from _spawn import run_distributed


def _local_bytes(t: torch.Tensor) -> tuple[int, str]:
    from torch.distributed.tensor import DTensor

    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size(), str(local.dtype)


def _measure(rank: int, world_size: int) -> dict:
    from hpcppo.config.experiment import FsdpSection
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.train.build import _sharded
    from hpcppo.train.optim import build_optimizer

    model = tiny_lm()
    n = sum(p.numel() for p in model.parameters())
    mesh = build_mesh("cpu", world_size, 1, hsdp=False)
    # As build.py does: float32 master weights, compute in model.dtype (bf16 here).
    _sharded(model, mesh, FsdpSection(), "bfloat16")
    optim = build_optimizer(model, lr=1e-3, weight_decay=0.0, betas=[0.9, 0.999])
    lm_loss(model, batch(rank)).backward()
    params = [_local_bytes(p) for p in model.parameters()]
    grads = [_local_bytes(p.grad) for p in model.parameters()]
    optim.step()
    moments = [_local_bytes(s[k]) for s in optim.state.values() for k in ("exp_avg", "exp_avg_sq")]
    return {"n": n, "params": params, "grads": grads, "moments": moments}


def test_the_planner_counts_what_fsdp_and_adamw_allocate():
    from hpcppo.sizing.catalog import ModelShape
    from hpcppo.sizing.estimate import _trained
    from hpcppo.config.experiment import FsdpSection

    results = run_distributed(_measure, 2)
    n = results[0]["n"]
    for kind, per_param in (("params", 4), ("grads", 4), ("moments", 8)):
        dtypes = {d for r in results for _, d in r[kind]}
        assert dtypes == {"torch.float32"}, (kind, dtypes)  # bf16 is only the compute dtype of gathered layers
        total = sum(b for r in results for b, _ in r[kind])
        assert total == per_param * n, (kind, total, n)
    planned = _trained(n, 2, FsdpSection())
    for r in results:  # dim-0 shards may be uneven by a row; the planner's per-rank share is the mean
        for kind, planned_bytes in (("params", planned.params), ("grads", planned.grads), ("moments", planned.optim)):
            assert abs(sum(b for b, _ in r[kind]) - planned_bytes) <= 0.1 * planned_bytes, kind

    cfg = tiny_lm().config
    shape = ModelShape("tiny-qwen2", cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
                       cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size, cfg.tie_word_embeddings,
                       attention_bias=True)
    assert shape.params == n
