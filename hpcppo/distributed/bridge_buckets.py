"""How :mod:`hpcppo.distributed.bridge` packs named tensors into buckets and unpacks them: the bucket plan.

A broadcast is a sequence of buckets. Each is either a flat buffer of one dtype holding several whole tensors back to
back (at most ``bucket_bytes``; one buffer per dtype is filled at a time, so a bf16 model with fp32 norms gives two
interleaved streams of buckets) or one tensor larger than a bucket, sent from its own memory. Before its bytes go,
each bucket's :class:`BucketHead` (dtype, element count, and the names, shapes and offsets of its tensors) is written
to the bridge's store: the broadcast's manifest, sent once, a bucket at a time, so that the sender never holds more
than its buckets (it streams ``iter_full_params``, which knows no name before it has gathered it).

Pure bookkeeping: no collective, no store (the bridge owns both); the tests of the bridge exercise it end to end.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Entry:
    """One tensor of a bucket: its name, its shape, and where its elements start in the bucket's flat buffer."""

    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class BucketHead:
    """What a receiver must know before a bucket's bytes arrive. ``single``: one tensor sent from its own memory
    (larger than a bucket), received into a tensor of its shape; otherwise a flat buffer of ``numel`` elements."""

    dtype: str  # str(torch.dtype), e.g. "torch.bfloat16": picklable without torch on the reader's side
    numel: int
    entries: tuple[Entry, ...]
    single: bool = False

    def torch_dtype(self) -> torch.dtype:
        return dtype_of(self.dtype)

    def views(self, flat: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """Each tensor of the bucket as a view of ``flat`` (the received buffer), in the order they were packed."""
        if self.single:
            yield self.entries[0].name, flat.view(self.entries[0].shape)
            return
        for e in self.entries:
            yield e.name, flat[e.offset:e.offset + e.numel].view(e.shape)


def dtype_of(name: str) -> torch.dtype:
    """``torch.bfloat16`` from ``"torch.bfloat16"`` (a head's dtype), refusing anything that is not a dtype."""
    value = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return value


@dataclass
class OpenBucket:
    """The bucket of one dtype being filled on the sender: its buffer and the entries packed so far."""

    buffer: torch.Tensor  # flat, ``capacity`` elements
    entries: list[Entry] = field(default_factory=list)
    used: int = 0

    @property
    def capacity(self) -> int:
        return self.buffer.numel()

    def fits(self, numel: int) -> bool:
        return self.used + numel <= self.capacity

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Copy ``tensor`` (any device, this dtype) into the buffer after the entries already packed."""
        n = tensor.numel()
        if n:
            self.buffer[self.used:self.used + n].view(tensor.shape).copy_(tensor)
        self.entries.append(Entry(name, tuple(tensor.shape), self.used))
        self.used += n

    def head(self) -> BucketHead:
        return BucketHead(str(self.buffer.dtype), self.used, tuple(self.entries))


def single_head(name: str, tensor: torch.Tensor) -> BucketHead:
    return BucketHead(str(tensor.dtype), tensor.numel(), (Entry(name, tuple(tensor.shape), 0),), single=True)


def capacity(bucket_bytes: int, dtype: torch.dtype) -> int:
    """Elements of ``dtype`` in a bucket of ``bucket_bytes`` (at least one)."""
    return max(1, bucket_bytes // dtype.itemsize)


def as_bytes(flat: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor, as the 1-D uint8 tensor a broadcast moves: every dtype (bool, float8, the
    ones a backend has no reduction for) travels the same way and arrives bit for bit."""
    return flat.reshape(-1).view(torch.uint8)
