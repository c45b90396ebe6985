"""Chunked log-probs on an FSDP2-sharded actor (2 gloo ranks): the stand-in LM head runs inside the root unit's
forward, so its gathered weight is there, and the root's backward hooks see its output; the gradients equal those of
the whole-logits path (hpcppo.models.forward_log_probs, issue 21)."""

from __future__ import annotations

import torch
from _models import tiny_lm
from _spawn import run_distributed


def _grads(rank: int, world_size: int) -> dict:
    from torch.distributed.tensor import DTensor

    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.models import forward_log_probs

    mesh = build_mesh("cpu", world_size, 1, hsdp=False)
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, 64, (3, 20), generator=g)
    mask, pos = torch.ones_like(ids), torch.arange(20).expand(3, -1)
    out = {}
    for name, chunk in (("whole", 1 << 40), ("chunked", 3 * 2 * 64)):  # 2 positions per chunk: 6 chunks
        for reshard in (True, False):
            model = tiny_lm()
            apply_fsdp(model, mesh, param_dtype=None, reduce_dtype=None, cpu_offload=False,
                       reshard_after_forward=reshard)
            lp, ent = forward_log_probs(model, ids, mask, pos, 12, temperature=0.8, with_entropy=True,
                                        chunk_elements=chunk)
            (lp.sum() - 0.1 * ent.sum()).backward()
            out[(name, reshard)] = (lp.detach(), {n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                                                  for n, p in model.named_parameters()})
    return out


def test_chunked_log_probs_under_fsdp2_give_the_whole_logits_gradients():
    for result in run_distributed(_grads, 2):
        for reshard in (True, False):
            lp_w, g_w = result[("whole", reshard)]
            lp_c, g_c = result[("chunked", reshard)]
            torch.testing.assert_close(lp_c, lp_w, rtol=0, atol=2e-6)
            assert g_w.keys() == g_c.keys() and "lm_head.weight" in g_w
            for name in g_w:
                torch.testing.assert_close(g_c[name], g_w[name], rtol=1e-5, atol=2e-6, msg=name)
