"""Gradient accumulation keeps gradients sharded (issue 31, item 1), on 2 real gloo ranks with an FSDP2 actor.

FSDP2's ``set_requires_gradient_sync(False)`` (FSDP1's ``no_sync``) keeps an unsharded gradient of every parameter
between micro-batches: the whole model's gradient on every rank. The update must instead reduce-scatter every
micro-batch, so that between micro-batches a rank holds its gradient shards and nothing else, and the optimizer step
sees the same gradient as one micro-batch of the whole mini-batch. Counted here: every live gradient tensor FSDP
holds for a parameter (the sharded ``.grad``, the unsharded parameter's ``.grad``, FSDP's unsharded accumulated
gradient, HSDP's partial reduce output), by storage (``distributed.fsdp.held_gradient_bytes``), after each micro-batch's backward and before the step.
"""

from __future__ import annotations

import torch
from _spawn import run_distributed

MINI = 8  # rows per rank in the mini-batch
LAYERS = 6  # deep enough that one layer's unsharded gradient is far below the whole model's


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=64, max_position_embeddings=64)
    return Qwen2ForCausalLM(cfg).train()


def _batch(rank: int) -> dict:
    from hpcppo.models import position_ids_from_mask

    g = torch.Generator().manual_seed(10 + rank)
    prompt, response = 4, 6
    attention_mask = torch.ones(MINI, prompt + response, dtype=torch.long)
    response_mask = torch.ones(MINI, response, dtype=torch.long)
    response_mask[::3, -2:] = 0  # uneven response lengths
    attention_mask[:, prompt:] = response_mask
    ids = torch.randint(1, 64, (MINI, prompt + response), generator=g) * attention_mask
    return {"input_ids": ids, "attention_mask": attention_mask, "position_ids": position_ids_from_mask(attention_mask),
            "responses": ids[:, prompt:], "response_mask": response_mask,
            "old_log_probs": (-4.1 + 0.2 * torch.randn(MINI, response, generator=g)) * response_mask,
            "advantages": torch.randn(MINI, response, generator=g) * response_mask}


def _run(rank: int, world_size: int, hsdp: bool) -> dict:
    from hpcppo.config import ActorSection
    from hpcppo.distributed.fsdp import apply_fsdp, held_gradient_bytes, largest_unit_bytes
    from hpcppo.distributed.mesh import build_mesh
    from hpcppo.train.optim import LRSchedule
    from hpcppo.train.update import UpdateSettings, actor_loss, run_update

    mesh = build_mesh("cpu", world_size, world_size if hsdp else 1, hsdp=hsdp)
    batch = _batch(rank)
    cfg = ActorSection(loss_agg_mode="token-mean")
    out: dict = {}
    for micro in (MINI, 1):  # one micro-batch, then MINI of them
        model = _model()
        apply_fsdp(model, mesh, param_dtype=None, reduce_dtype=torch.float32, cpu_offload=False,
                   reshard_after_forward=True)
        shard_bytes = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
        unit_bytes = largest_unit_bytes(model)
        seen: list[int] = []
        grads: dict = {}
        inner = actor_loss(model, cfg, clip_ratio_low=0.2, clip_ratio_high=0.2, kl_loss=False, temperature=1.0)

        def loss(mb, info, sums, n_micro, _inner=inner, _model=model, _seen=seen):
            _seen.append(held_gradient_bytes(_model))  # what the previous micro-batches' backwards left behind
            return _inner(mb, info, sums, n_micro)

        optim = torch.optim.SGD(model.parameters(), lr=1.0)
        real_step = optim.step

        def step(*a, _model=model, _seen=seen, _grads=grads, **k):
            _seen.append(held_gradient_bytes(_model))
            _grads.update((n, p.grad.full_tensor().clone()) for n, p in _model.named_parameters())
            return real_step(*a, **k)

        optim.step = step  # type: ignore[method-assign]
        lr = LRSchedule(optim, base_lr=1.0, warmup_steps=0, total_steps=0, schedule="constant", min_lr_ratio=0.0)
        settings = UpdateSettings(prefix="actor", epochs=1, mini_batch_per_rank=MINI, micro_batch_per_rank=micro,
                                  grad_clip=1e9, world_size=world_size, max_response_length=6)
        run_update(batch, model, optim, lr, settings, loss)
        out[micro] = {"grads": grads, "grad_bytes": seen, "shard_bytes": shard_bytes, "unit_bytes": unit_bytes,
                      "model_bytes": sum(g.numel() * g.element_size() for g in grads.values())}
    return out


def _check(results: list[dict], *, sharded: bool) -> None:
    for r in results:
        one, many = r[MINI], r[1]
        assert len(many["grad_bytes"]) == MINI + 1  # MINI loss calls + the step
        # Between micro-batches: the shards and nothing else (the unsharded layer in backward is freed by then)...
        bound = many["shard_bytes"] + many["unit_bytes"]
        assert max(many["grad_bytes"]) <= bound, (many["grad_bytes"], bound)
        if sharded:  # ... far below the whole model's gradient, which no-sync accumulation would hold
            assert bound < 0.8 * many["model_bytes"]
            assert max(many["grad_bytes"]) <= many["shard_bytes"]
        # The same gradient at the optimizer step as one micro-batch of the whole mini-batch (1e-6 relative).
        assert len(one["grads"]) == len(many["grads"]) > 0
        assert max(float(g.abs().max()) for g in one["grads"].values()) > 1e-4
        for name, g in one["grads"].items():
            scale = float(g.abs().max())
            assert scale > 0, name
            assert float((many["grads"][name] - g).abs().max()) <= 1e-6 * scale, name


def test_accumulation_over_micro_batches_keeps_only_gradient_shards_and_the_same_gradient():
    _check(run_distributed(_run, 2, False), sharded=True)


def test_hsdp_accumulation_all_reduces_once_and_gives_the_same_gradient():
    # 2 "nodes" x 1 rank: the replicate dimension is the one whose all-reduce waits for the last micro-batch.
    _check(run_distributed(_run, 2, True), sharded=False)
