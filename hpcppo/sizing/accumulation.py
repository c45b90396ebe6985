"""Gradient accumulation in the plan: the gradient memory an update holds and the reduce-scatters it sends (no torch).

The trainer accumulates sharded gradients (hpcppo/train/update.py): FSDP2 reduce-scatters every micro-batch's
gradients, and under HSDP only the all-reduce across replicas waits for the mini-batch's last micro-batch
(``set_requires_all_reduce(False)`` before it). What that keeps and costs in torch 2.13
(torch/distributed/fsdp/_fully_shard/):

* ``FSDPParamGroup.post_backward`` (_fsdp_param_group.py) takes each layer's unsharded gradients as autograd made
  them, in the compute dtype of the gathered parameters (``param_dtype``, e.g. bf16), and hands them to
  ``foreach_reduce`` (_fsdp_collectives.py), which allocates ``reduce_scatter_input`` with the layer's whole
  (padded) size in ``reduce_dtype`` (fp32 by default), copies and casts the gradients into it
  (``foreach_reduce_scatter_copy_in``), frees them, and reduce-scatters into a shard-sized output. That output is
  cast to the parameter's dtype (fp32: the float32 master weights) and becomes, or is added to, the sharded ``.grad``
  (``sharded_param.grad._local_tensor += new_sharded_grad``): the fp32 shard, the only gradient kept between
  micro-batches.
* The reduce-scatter input stays alive until the next layer's ``post_backward`` (``comm_ctx.reduce_scatter_states``,
  at most ``reduce_scatter_max_input_buffers`` = 1), while that layer's autograd gradients are being made: in flight
  at once, one layer's unsharded gradients in the compute dtype and one layer's in the reduce dtype.
* The root unit (embeddings, LM head, final norm) is reduce-scattered at the end of backward: the LM head's
  unsharded gradient (compute dtype), made first, waits through the whole backward.
* HSDP with ``all_reduce_grads`` false: ``foreach_reduce`` keeps ``partial_reduce_output`` (shard-sized, reduce dtype)
  instead of setting ``.grad``, and adds it in at the last micro-batch before the all-reduce: at most the fp32 shard.

The old no-sync accumulation (``set_requires_gradient_sync(False)``) kept ``unsharded_accumulated_grad`` for every
parameter, the whole model's gradient unsharded on each GPU; the trainer no longer has it.
"""

from __future__ import annotations

import math

from hpcppo.sizing.catalog import ModelShape

__all__ = ["DTYPE_SHORT", "grads_in_flight", "grad_item_label", "micro_batches_per_optimizer_step",
           "reduce_scatter_bytes"]

DTYPE_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def grads_in_flight(m: ModelShape, layer_params: int, pbytes: int, rbytes: int) -> int:
    """Unsharded gradient bytes on a GPU at the peak of a backward: one layer's in the compute dtype (autograd's),
    one layer's in the reduce dtype (the previous layer's reduce-scatter input), and the LM head's in the compute
    dtype (waiting for the root's reduce-scatter). Never more than one layer's, whatever the micro-batches."""
    return layer_params * (pbytes + rbytes) + m.vocab * m.hidden * pbytes


def grad_item_label(role: str, shard_bytes: int, in_flight: int, param_dtype: str, reduce_dtype: str) -> str:
    """The update's gradient line: the fp32 shard accumulated across micro-batches (on the host with
    ``param_offload``: ``shard_bytes`` 0) plus what is in flight."""
    p, r = DTYPE_SHORT[param_dtype], DTYPE_SHORT[reduce_dtype]
    flight = f"one layer unsharded in flight {in_flight / 2**30:.1f} GiB ({p} + {r} reduce-scatter input, LM head {p})"
    if not shard_bytes:
        return f"{role} grads: {flight}; the fp32 shard on the host"
    return f"{role} grads: fp32 shard {shard_bytes / 2**30:.1f} GiB + {flight}"


def micro_batches_per_optimizer_step(per_rank: int, rows: int, budget: int, seq_len: int) -> int:
    """Forward/backward passes of one rank per optimizer step, worst case (every sequence ``seq_len`` long): each
    reduce-scatters its gradients. Fixed-size micro-batches: ``per_rank / rows``; a token budget
    (``max_tokens_per_micro_batch``, hpcppo.train.batching.pack_rows) holds ``budget // seq_len`` full sequences."""
    per_micro = max(1, budget // seq_len) if budget > 0 else max(1, rows)
    return max(1, math.ceil(per_rank / per_micro))


def reduce_scatter_bytes(n_grads: int, rbytes: int, shard: int) -> float:
    """Bytes each GPU sends (and receives) in one reduce-scatter of ``n_grads`` gradients in the reduce dtype over a
    shard group of ``shard`` GPUs (ring: ``(shard - 1) / shard`` of the input)."""
    return n_grads * rbytes * (shard - 1) / shard
