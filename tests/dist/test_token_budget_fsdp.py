"""Token-budget micro-batches on 2 real gloo ranks with an FSDP2-sharded actor (issue 21, item 2): the ranks' rows
need different numbers of micro-batches, the count is agreed (the larger), every rank runs that many forwards and
backwards (a rank running fewer would leave the other waiting in an all-gather until the group's timeout), and the
update gives the gradient of fixed-size micro-batches, trimmed or with the rows packed without padding; the log-prob
pass comes back in row order."""

from __future__ import annotations

import torch
from _models import tiny_lm
from _spawn import run_distributed

# rank 0: short rows (one micro-batch holds them all); rank 1: long ones (several)
SHAPES = {0: ([3, 2, 4, 1, 3, 2], [2, 1, 3, 2, 1, 2]), 1: ([4, 6, 2, 5, 3, 6], [20, 3, 18, 9, 25, 14])}
BUDGET = 64


def _batch(rank: int) -> dict:
    from hpcppo.models import position_ids_from_mask

    prompts, responses = SHAPES[rank]
    g = torch.Generator().manual_seed(rank)
    b, p_w, r_w = len(prompts), max(prompts), max(responses)
    prompt_mask = torch.tensor([[0] * (p_w - p) + [1] * p for p in prompts])
    response_mask = torch.tensor([[1] * r + [0] * (r_w - r) for r in responses])
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    ids = torch.randint(1, 64, (b, p_w + r_w), generator=g) * attention_mask
    return {"input_ids": ids, "attention_mask": attention_mask, "position_ids": position_ids_from_mask(attention_mask),
            "responses": ids[:, p_w:], "response_mask": response_mask,
            "old_log_probs": (-4.1 + 0.2 * torch.randn(b, r_w, generator=g)) * response_mask,
            "advantages": torch.randn(b, r_w, generator=g) * response_mask}


def _run(rank: int, world_size: int) -> dict:
    from torch.distributed.tensor import DTensor

    from hpcppo.config import ActorSection
    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.models import compute_log_probs
    from hpcppo.train import batching
    from hpcppo.train.optim import LRSchedule
    from hpcppo.train.update import UpdateSettings, actor_loss, run_update

    mesh = build_mesh("cpu", world_size, 1, hsdp=False)
    batch = _batch(rank)
    response_len = batch["responses"].shape[1]
    out: dict = {"fewest": len(batching.pack_rows(*SHAPES[rank], BUDGET))}
    [groups] = batching.token_budget_groups([batch["attention_mask"]], response_len, BUDGET)
    out["agreed"] = len(groups)
    [packed_groups] = batching.token_budget_groups([batch["attention_mask"]], response_len, BUDGET, packed=True)
    out["agreed_packed"] = len(packed_groups)
    cfg = ActorSection(loss_agg_mode="seq-mean-token-mean")
    for name, budget, packed in (("fixed", 0, False), ("budget", BUDGET, False), ("packed", BUDGET, True)):
        model = tiny_lm()
        apply_fsdp(model, mesh, param_dtype=None, reduce_dtype=None, cpu_offload=False, reshard_after_forward=True)
        before = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
        args = (batch["input_ids"], batch["attention_mask"], batch["position_ids"], response_len)
        out[name + "_lp"] = compute_log_probs(model, *args, micro_batch_size=2, packed=packed,
                                              micro_batches=(packed_groups if packed else groups) if budget else None)
        optim = torch.optim.SGD(model.parameters(), lr=1.0)
        lr = LRSchedule(optim, base_lr=1.0, warmup_steps=0, total_steps=0, schedule="constant", min_lr_ratio=0.0)
        settings = UpdateSettings(prefix="actor", epochs=1, mini_batch_per_rank=6, micro_batch_per_rank=2,
                                  grad_clip=1e9, world_size=world_size, max_response_length=32,
                                  max_tokens_per_micro_batch=budget, remove_padding=packed)
        loss = actor_loss(model, cfg, clip_ratio_low=0.2, clip_ratio_high=0.2, kl_loss=False, temperature=1.0,
                          packed=packed)
        run_update(batch, model, optim, lr, settings, loss)
        out[name] = {n: before[n] - (p.full_tensor() if isinstance(p, DTensor) else p).detach()
                     for n, p in model.named_parameters()}
    out["mask"] = batch["response_mask"].bool()
    return out


def test_ranks_agree_on_the_count_and_the_update_gives_the_fixed_size_gradient():
    results = run_distributed(_run, 2)
    assert [r["fewest"] for r in results] == [1, 3]  # the ranks alone would run different numbers of passes
    assert [r["agreed"] for r in results] == [3, 3]
    assert [r["agreed_packed"] for r in results] == [2, 2]  # packed micro-batches count real tokens: fewer
    for r in results:
        assert max(float(g.abs().max()) for g in r["fixed"].values()) > 1e-4
        for path in ("budget", "packed"):
            torch.testing.assert_close(r[path + "_lp"][r["mask"]], r["fixed_lp"][r["mask"]], rtol=0, atol=1e-5)
            for name, g in r["fixed"].items():
                torch.testing.assert_close(r[path][name], g, rtol=0, atol=1e-5, msg=f"{path}: {name}")
