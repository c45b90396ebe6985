"""sum_pi_squared from the old-log-prob pass on an FSDP2-sharded actor (2 gloo ranks), gathered as the trainer
gathers the old log-probs for the estimator (hpcppo.train.batching.gather_rows): the values equal one process's on
the unsharded model, on fixed-size, token-budget (counts agreed across ranks) and packed micro-batches (issue 33)."""

from __future__ import annotations

import torch
from _models import tiny_lm
from _spawn import run_distributed

# rank 0: short rows, rank 1: long ones (the ranks need different numbers of token-budget micro-batches)
SHAPES = {0: ([3, 2, 4, 1], [2, 1, 3, 2]), 1: ([4, 6, 2, 5], [20, 3, 18, 9])}
BUDGET, TEMPERATURE = 48, 0.7


def _batch(rank: int) -> tuple[torch.Tensor, ...]:
    from hpcppo.models import position_ids_from_mask

    prompts, responses = SHAPES[rank]
    g = torch.Generator().manual_seed(rank)
    p_w, r_w = max(prompts), max(responses)
    prompt_mask = torch.tensor([[0] * (p_w - p) + [1] * p for p in prompts])
    response_mask = torch.tensor([[1] * r + [0] * (r_w - r) for r in responses])
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    ids = torch.randint(1, 64, (len(prompts), p_w + r_w), generator=g) * mask
    return ids, mask, position_ids_from_mask(mask), response_mask


def _actor() -> torch.nn.Module:
    model = tiny_lm()
    with torch.no_grad():  # sharper than a fresh init's near-uniform distributions
        model.lm_head.weight.mul_(20.0)
    return model


def _run(rank: int, world_size: int) -> dict:
    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.models import compute_log_prob_outputs
    from hpcppo.train import batching

    mesh = build_mesh("cpu", world_size, 1, hsdp=False)
    ids, mask, pos, response_mask = _batch(rank)
    response_len = response_mask.shape[1]
    model = _actor()
    apply_fsdp(model, mesh, param_dtype=None, reduce_dtype=None, cpu_offload=False, reshard_after_forward=True)
    out = {}
    for name, budget, packed in (("fixed", 0, False), ("budget", BUDGET, False), ("packed", BUDGET, True)):
        groups = batching.token_budget_groups([mask], response_len, budget, packed=packed)[0] if budget else None
        got = compute_log_prob_outputs(model, ids, mask, pos, response_len, temperature=TEMPERATURE,
                                       with_sum_pi_squared=True, micro_batch_size=2, micro_batches=groups,
                                       packed=packed)
        assert got.sum_pi_squared is not None
        out[name] = batching.gather_rows({"old_log_probs": got.log_probs, "sum_pi_squared": got.sum_pi_squared,
                                          "response_mask": response_mask})
    return out


def _one_process() -> dict[str, torch.Tensor]:
    """The whole batch (both ranks' rows, right-padded to the wider response) on the unsharded model."""
    from hpcppo.models import compute_log_prob_outputs

    model = _actor()
    width = max(max(SHAPES[r][1]) for r in SHAPES)
    parts: dict[str, list[torch.Tensor]] = {"sum_pi_squared": [], "old_log_probs": [], "response_mask": []}
    for rank in SHAPES:
        ids, mask, pos, response_mask = _batch(rank)
        got = compute_log_prob_outputs(model, ids, mask, pos, response_mask.shape[1], temperature=TEMPERATURE,
                                       with_sum_pi_squared=True, micro_batch_size=len(ids))
        pad = (0, width - response_mask.shape[1])
        parts["sum_pi_squared"].append(torch.nn.functional.pad(got.sum_pi_squared, pad))
        parts["old_log_probs"].append(torch.nn.functional.pad(got.log_probs, pad))
        parts["response_mask"].append(torch.nn.functional.pad(response_mask, pad))
    return {k: torch.cat(v) for k, v in parts.items()}


def test_sharded_and_gathered_values_equal_one_process():
    want = _one_process()
    mask = want["response_mask"].bool()
    assert want["sum_pi_squared"][mask].min() > 2.0 / 64  # far from uniform over the 64 tokens
    results = run_distributed(_run, 2)
    for rank, result in enumerate(results):
        for path, got in result.items():
            assert torch.equal(got["response_mask"].bool(), mask), (rank, path)
            torch.testing.assert_close(got["sum_pi_squared"][mask], want["sum_pi_squared"][mask], rtol=1e-5, atol=0,
                                       msg=f"rank {rank}, {path}")
            torch.testing.assert_close(got["old_log_probs"][mask], want["old_log_probs"][mask], rtol=0, atol=1e-5,
                                       msg=f"rank {rank}, {path}")
    for path in results[0]:  # every rank holds the same gathered batch, as the estimator needs
        assert torch.equal(results[0][path]["sum_pi_squared"], results[1][path]["sum_pi_squared"])
