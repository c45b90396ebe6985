"""Stream full weights out of an FSDP2 model, one parameter at a time, under Hugging Face names.

This is how a rollout engine (a plain, unsharded copy of the actor; or vLLM's ``load_weights``) gets fresh
weights after every update without ever holding two full state dicts: consecutive sharded parameters are
all-gathered together in buckets of about ``bucket_bytes`` (one collective per bucket instead of one per parameter),
handed to the consumer one by one, and dropped before the next bucket is gathered. A consumer that offers its own
tensors (``into``: the HF engine's parameters) has the large parameters gathered straight into them instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeGuard, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Shard

# Full (gathered) bytes per all-gather. Small parameters (norms, biases: a 7B model has ~340 tensors, half of them
# KBs) share one collective instead of paying a launch and DTensor's dispatch each; a parameter at least this large is
# gathered alone, straight into its full tensor (no copy), as before. Measured on gloo, 2 ranks, 86.5M parameters
# (tools/bench_scale.py's model): one gather per parameter 0.45-0.58 s, 8 MB buckets 0.38-0.44 s; buckets of 64 MB
# and more were slower (0.6-1.1 s), each a fresh host allocation that page-faults on every sync.
DEFAULT_BUCKET_BYTES = 8 << 20
# A parameter at least this large (full bytes) goes straight into the consumer's tensor when one is offered
# (``iter_full_params(into=...)``); smaller ones stay in buckets, where they share one collective.
DIRECT_MIN_BYTES = 1 << 20
# In-place gathers are started ahead of the consumer up to this many full bytes (the targets exist already: it costs
# no memory, only how soon the first one is handed over).
IN_FLIGHT_WINDOW = 64 << 20

# Wrapper prefixes that are not part of the Hugging Face name: activation-checkpoint wrappers, FSDP1 wrappers,
# torch.compile's OptimizedModule.
_WRAPPER_PARTS = ("_checkpoint_wrapped_module", "_fsdp_wrapped_module", "_orig_mod")


def clean_name(name: str) -> str:
    """Drop wrapper components from a dotted parameter name.

    >>> clean_name("model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight")
    'model.layers.0.mlp.up_proj.weight'
    """
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_PARTS)


def _by_broadcasts(inp: torch.Tensor, group: dist.ProcessGroup) -> bool:
    """Whether :func:`_all_gather` gathers ``inp`` with one broadcast per rank: host tensors on gloo."""
    return inp.device.type == "cpu" and "gloo" in str(dist.get_backend(group))


def _all_gather(out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup, *,
                wait: bool = True) -> list[dist.Work]:
    """One all-gather of equal-sized inputs into ``out`` (rank-major); its works, waited for unless ``wait=False``.

    On gloo (host tensors) it is one broadcast from each rank of the group, all in flight at once: the same bytes
    reach every rank, and gloo moves them much faster than through its own all-gather. Measured here (2 cores, TCP
    loopback, torch 2.13): 173 MB per rank on 2 ranks, ``all_gather_into_tensor`` 0.32-0.47 s, two broadcasts
    0.11-0.15 s, an exchange over a bare TCP socket 0.11 s; 346 MB in 8 MB buckets on 2 / 3 / 4 ranks, all-gather
    0.26 / 0.31 / 0.44 s, broadcasts 0.20 / 0.27 / 0.31 s. Any other backend (NCCL) uses its all-gather. torch 2.13
    renamed ``all_gather_into_tensor`` to ``all_gather_single`` (the old name warns); vLLM's pins may be either side.
    """
    if _by_broadcasts(inp, group):
        return _broadcast_parts(out.split(inp.numel()), inp, group, wait=wait)
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    work = fn(out, inp, group=group, async_op=not wait)
    return [] if wait else [work]


def _broadcast_parts(parts: list[torch.Tensor] | tuple[torch.Tensor, ...], own: torch.Tensor,
                     group: dist.ProcessGroup, *, wait: bool = True) -> list[dist.Work]:
    """Fill ``parts[r]`` on every rank with rank ``r``'s ``own`` (copied, and cast, into its part here first): one
    async broadcast per non-empty part, all in flight together; their works, waited for unless ``wait=False``.
    Every rank must pass parts of the same sizes."""
    parts[dist.get_rank(group)].copy_(own)
    works = [dist.broadcast(part, group_src=src, group=group, async_op=True)
             for src, part in enumerate(parts) if part.numel()]
    if wait:
        for work in works:
            work.wait()
    return works


def _start_gather_into(target: torch.Tensor, local: torch.Tensor, group: dist.ProcessGroup, size: int, rank: int,
                       chunk: int) -> list[dist.Work] | None:
    """Start gathering a ``Shard(0)`` parameter straight into ``target`` (contiguous, its full shape, dtype and
    device) and return the works to wait for; None, with nothing communicated, when that would need a padded buffer
    (the backend's all-gather of a first dimension that does not divide by ``size``). Rank ``r``'s rows are rows
    ``[r * chunk, (r + 1) * chunk)`` of the full tensor: a contiguous slice of ``target``, which a broadcast fills
    in place."""
    rows = target.shape[0]
    if _by_broadcasts(target, group):
        parts = [target[min(rows, r * chunk):min(rows, (r + 1) * chunk)] for r in range(size)]
        return _broadcast_parts(parts, local, group, wait=False)
    if rows % size:
        return None
    return _all_gather(target, local.to(device=target.device, dtype=target.dtype).contiguous(), group, wait=False)


def _fits(target: torch.Tensor | None, shape: torch.Size, dtype: torch.dtype,
          device: torch.device) -> TypeGuard[torch.Tensor]:
    """Whether ``target`` can receive a gather of a parameter of this full shape, in this dtype, on the mesh's
    ``device`` (type only for CPU; the current device for an accelerator, where the collective runs)."""
    if target is None or target.shape != shape or target.dtype != dtype or not target.is_contiguous():
        return False
    if device.type == "cpu":
        return target.device.type == "cpu"
    module = getattr(torch, device.type, None)
    return target.device.type == device.type and module is not None and target.device.index == module.current_device()


@dataclass(frozen=True)
class _Piece:
    """One parameter of a bucket: this rank's rows of it, and how the full tensor is cut over the shard group."""

    name: str
    local: torch.Tensor  # this rank's rows (not yet cast or moved)
    shape: torch.Size  # full shape
    chunk: int  # rows per rank, the last ranks' chunks padded (torch.chunk's split, which Shard(0) uses)

    @property
    def row_numel(self) -> int:
        return math.prod(self.shape[1:])


def _shard_group(t: DTensor) -> tuple[dist.ProcessGroup, int, int] | None:
    """``(group, size, rank)`` of the mesh dimension ``t`` is ``Shard(0)`` on, when every other dimension is
    ``Replicate`` (FSDP2: ``(Shard(0),)``; HSDP: ``(Replicate(), Shard(0))``); None for any other layout."""
    dims = [i for i, p in enumerate(t.placements) if isinstance(p, Shard) and p.dim == 0]
    if len(dims) != 1 or t.dim() == 0 or not all(p.is_replicate() for i, p in enumerate(t.placements) if i != dims[0]):
        return None
    mesh = t.device_mesh
    return mesh.get_group(dims[0]), mesh.size(dims[0]), mesh.get_local_rank(dims[0])


def _gather_bucket(pieces: list[_Piece], group: dist.ProcessGroup, size: int, rank: int, dtype: torch.dtype,
                   device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """All-gather ``pieces`` in one collective; yield each full tensor (a fresh copy, or a view of the gathered
    buffer when the bucket holds one parameter)."""
    sizes = [p.chunk * p.row_numel for p in pieces]
    send = torch.empty(sum(sizes), dtype=dtype, device=device)
    offset = 0
    for p, n in zip(pieces, sizes):
        rows = min(p.chunk, max(0, p.shape[0] - rank * p.chunk))
        if p.local.shape[0] != rows:  # DTensor's Shard(0) contract: torch.chunk's split, empty chunks at the end
            raise RuntimeError(f"{p.name}: rank {rank} of {size} holds {p.local.shape[0]} rows of {tuple(p.shape)}, "
                               f"expected {rows} (torch.chunk split)")
        send[offset:offset + rows * p.row_numel].view(rows, *p.shape[1:]).copy_(p.local)  # casts and moves
        offset += n  # the padding rows stay uninitialised: they are cut off after the gather
    recv = torch.empty(size * send.numel(), dtype=dtype, device=device)
    _all_gather(recv, send, group)
    if len(pieces) == 1:  # rank-major = row-major: the full tensor is the gathered buffer's leading rows
        p = pieces[0]
        yield p.name, recv.view(size * p.chunk, *p.shape[1:])[: p.shape[0]]
        return
    by_rank = recv.view(size, send.numel())
    offset = 0
    for p, n in zip(pieces, sizes):
        # One copy (reshape copies a column block of the [ranks, bucket] buffer, unless it is a single row block).
        full = by_rank[:, offset:offset + n].reshape(size * p.chunk, *p.shape[1:])[: p.shape[0]].contiguous()
        offset += n
        yield p.name, full
        del full


def _drain(in_flight: list[tuple[str, torch.Tensor, list[dist.Work], int]],
           keep_bytes: int = -1) -> Iterator[tuple[str, torch.Tensor]]:
    """Wait for in-place gathers ``(name, target, works, full bytes)``, oldest first, and yield their
    ``(name, target)``, until at most ``keep_bytes`` are left in flight (all of them by default)."""
    while in_flight and sum(g[3] for g in in_flight) > keep_bytes:
        name, target, works, _ = in_flight.pop(0)
        for work in works:
            work.wait()
        yield name, target


def iter_full_params(
    model: nn.Module,
    *,
    dtype: torch.dtype | Callable[[str], torch.dtype | None] | None = None,
    include_buffers: bool = False,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    into: Mapping[str, torch.Tensor] | None = None,
    direct_min_bytes: int = DIRECT_MIN_BYTES,
    in_flight_window: int = IN_FLIGHT_WINDOW,
    force_gather: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full_tensor)`` for every parameter of ``model`` (sharded or not), once each, in an order
    that is the same on every rank and every call: ``named_parameters``' order, except that with ``into`` the
    bucketed parameters are yielded when their bucket is full (or at the end), not before the in-place ones that
    follow them, which keeps the in-place gathers in flight (2 ranks, 86.5M parameters, 12 interleaved syncs each:
    median 0.202 s [0.186-0.249] -> 0.167 s [0.159-0.200]).

    COLLECTIVE: for an FSDP model every rank must create this iterator and consume it to the end, in step with
    the others — the gathers run as the iterator advances, so a rank that stops early (or iterates alone) deadlocks
    the rest until the process-group timeout. Each yielded tensor has the parameter's full shape (e.g.
    ``[vocab, hidden]``), on the device the gather ran on. It may share memory with the training weights (an
    unsharded model, or a 1-rank mesh where the gather is a no-op) or with the gather's buffer: treat it as
    read-only, copy it, let it go.
    ``dtype`` (e.g. ``torch.bfloat16``) casts the local shard *before* the gather, halving traffic for a bf16 engine;
    a function of the (clean) name gives each parameter its own (None: as stored), e.g. the master dtype for the
    LoRA tensors a merge needs and the engine's for the rest (``hpcppo.train.lora.actor_weights``).
    ``bucket_bytes``: consecutive ``Shard(0)`` parameters of one dtype and shard group (leaving out those gathered in
    place) are gathered together, one collective (:func:`_all_gather`) per ~``bucket_bytes`` of full tensors (a larger
    parameter is gathered alone, without a copy); peak extra memory is one bucket plus the parameter being yielded. Any other layout goes through
    ``DTensor.full_tensor()`` one parameter at a time.
    ``into`` (the consumer's own tensors by Hugging Face name, e.g. ``HFRolloutEngine.sync_targets``): a sharded
    parameter of at least ``direct_min_bytes`` whose entry is contiguous, of its full shape, in the gather's dtype and
    on the mesh's device is gathered straight into that entry, which is then what is yielded (the consumer finds its
    own tensor and need not copy): no gather buffer, no copy out of it. Every rank must pass alike ``into`` (the
    same names, shapes and dtypes): the choice of path is made on each rank and the collectives must match.
    In-place gathers are started up to ``in_flight_window`` full bytes ahead of the one being yielded.
    A shard group of one rank holds whole tensors and is read without a collective, unless ``force_gather``: then it
    goes through the bucketed and in-place gathers as several ranks do (for a check on one GPU, tools/gpu_check.sh).
    Tied parameters are yielded once (as ``named_parameters`` does).
    ``include_buffers`` also yields persistent buffers (replicated in FSDP2, so no collective).
    """
    # A module left unsharded (reshard_after_forward=False after a no-grad forward) registers plain unsharded
    # tensors; resharding (local, no collective) puts the DTensors back so every rank sees the same names/order.
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    with torch.no_grad():
        stream = _Gathers(bucket_bytes=bucket_bytes, into=into, direct_min_bytes=direct_min_bytes,
                          in_flight_window=in_flight_window)
        for name, param in model.named_parameters():
            tensor = param.detach()
            name = clean_name(name)
            want = dtype(name) if callable(dtype) else dtype
            layout = _shard_group(tensor) if isinstance(tensor, DTensor) else None
            if layout is not None and (layout[1] > 1 or force_gather):
                yield from stream.add(name, cast(DTensor, tensor), layout, want)
                continue
            yield from stream.flush()
            yield name, _whole(tensor, want)
        yield from stream.flush()
        if include_buffers:
            yield from _persistent_buffers(model)


class _Gathers:
    """The collectives of one :func:`iter_full_params` pass over sharded parameters: the open bucket of ``Shard(0)``
    parameters that share a group, dtype and device, and the in-place gathers in flight (oldest first)."""

    def __init__(self, *, bucket_bytes: int, into: Mapping[str, torch.Tensor] | None, direct_min_bytes: int,
                 in_flight_window: int) -> None:
        self.bucket_bytes, self.into = bucket_bytes, into
        self.direct_min_bytes, self.in_flight_window = direct_min_bytes, in_flight_window
        self.bucket: list[_Piece] = []
        self.where: tuple = ()  # the bucket's (group, size, rank, dtype, device): what its parameters share
        self.bucket_full = 0
        self.in_flight: list[tuple[str, torch.Tensor, list[dist.Work], int]] = []

    def add(self, name: str, shard: DTensor, layout: tuple[dist.ProcessGroup, int, int],
            want: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
        """Start ``shard``'s gather: straight into the consumer's tensor when ``into`` has one that fits, else into
        the bucket (gathering the bucket first when the parameter does not belong with it); yield what completes."""
        # CPU-offloaded shards are gathered on the mesh's device (NCCL cannot gather host memory).
        here = (*layout, want or shard.dtype, torch.device(shard.device_mesh.device_type))
        full = shard.numel() * here[3].itemsize
        chunk = -(-shard.shape[0] // layout[1])
        target = self.into.get(name) if self.into is not None and full >= self.direct_min_bytes else None
        if _fits(target, shard.shape, here[3], here[4]):
            # The open bucket stays open, and a bucketed parameter does not wait for the in-place gathers in
            # flight: either wait would leave the link idle between two in-place gathers.
            assert target is not None  # _fits
            works = _start_gather_into(target, shard.to_local(), *layout, chunk)
            if works is not None:
                # In flight together up to a window: one parameter's messages alone leave the link idle between
                # them (2 ranks, 86.5M parameters: 0.22-0.28 s waiting one by one).
                self.in_flight.append((name, target, works, full))
                yield from _drain(self.in_flight, self.in_flight_window)
                return
        if self.bucket and (here != self.where or self.bucket_full + full > self.bucket_bytes):
            yield from self._gather_bucket()
        self.where = here
        self.bucket.append(_Piece(name, shard.to_local(), shard.shape, chunk))
        self.bucket_full += full

    def flush(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Finish every gather started: the in-place ones, then the bucket."""
        yield from _drain(self.in_flight)
        if self.bucket:
            yield from self._gather_bucket()

    def _gather_bucket(self) -> Iterator[tuple[str, torch.Tensor]]:
        bucket, self.bucket, self.bucket_full = self.bucket, [], 0
        yield from _gather_bucket(bucket, *self.where)


def _whole(tensor: torch.Tensor, want: torch.dtype | None) -> torch.Tensor:
    """A parameter that needs no bucketed gather: cast, and a DTensor of any other layout gathered whole on its
    mesh's device (``full_tensor``)."""
    if want is not None:
        tensor = tensor.to(want)
    if isinstance(tensor, DTensor):
        mesh_device = tensor.device_mesh.device_type
        if tensor.device.type != mesh_device:
            tensor = tensor.to(mesh_device)  # still a DTensor
        tensor = cast(DTensor, tensor).full_tensor()
    return tensor


def _persistent_buffers(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The persistent buffers (replicated in FSDP2: no collective), by Hugging Face name."""
    non_persistent = {
        f"{mod_name}.{b}" if mod_name else b
        for mod_name, mod in model.named_modules()
        for b in getattr(mod, "_non_persistent_buffers_set", ())
    }
    for name, buf in model.named_buffers():
        if name not in non_persistent:
            yield clean_name(name), buf.detach()


def load_into(
    module: nn.Module,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    strict: bool = True,
) -> list[str]:
    """Copy ``named_tensors`` into the plain (unsharded) ``module``'s parameters and buffers, by cleaned name.

    Each tensor is consumed as it arrives (pass ``iter_full_params(...)`` directly to stream). Dtype and device are
    converted by ``copy_`` (an fp32 actor into a bf16 engine is fine); shapes must match exactly. Raises
    ``KeyError`` for a name the module lacks, ``ValueError`` for a shape mismatch, and with ``strict`` a
    ``KeyError`` listing parameters that received nothing. Returns the names loaded, in order.
    """
    targets: dict[str, torch.Tensor] = {clean_name(n): p for n, p in module.named_parameters()}
    params = set(targets)
    for n, b in module.named_buffers():
        targets.setdefault(clean_name(n), b)
    loaded: list[str] = []
    with torch.no_grad():
        for name, tensor in named_tensors:
            target = targets.get(name)
            if target is None:
                raise KeyError(f"{type(module).__name__} has no parameter or buffer named {name!r}")
            if isinstance(target, DTensor):
                raise TypeError(f"load_into expects an unsharded module; {name!r} is a DTensor")
            if target.shape != tensor.shape:
                raise ValueError(f"shape mismatch for {name!r}: module has {tuple(target.shape)}, "
                                 f"source has {tuple(tensor.shape)}")
            target.copy_(tensor)
            loaded.append(name)
    if strict:
        missing = sorted(params - set(loaded))
        if missing:
            raise KeyError(f"{len(missing)} parameters were not in the source: {missing[:5]}"
                           + (" ..." if len(missing) > 5 else ""))
    return loaded
