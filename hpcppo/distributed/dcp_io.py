"""How hpcppo's checkpoints lay tensors out in DCP's files, and read them back without a staging copy.

DCP's ``FileSystemReader.read_data`` (torch 2.13, torch/distributed/checkpoint/filesystem.py) ``torch.load``s every
stored tensor (each item of a ``.distcp`` file is a ``torch.save`` zip archive) into a new CPU tensor, then
``copy_``s it into the state dict's tensor: the weights-only unpickler, a fresh allocation and a second pass over
every byte (86.5M-parameter model of ``tools/bench_scale.py``, one rank, 1 GB: 0.34-0.48 s in ``torch.load`` and
0.12-0.31 s in the copies, against 0.19-0.28 s for one plain ``readinto`` of the same bytes).

* :class:`ContiguousSavePlanner` (saving) stores every tensor contiguous (``Tensor.contiguous()``: the same values,
  row-major), so the bytes of each item's ``data/0`` record are the tensor in row-major order. The checkpoint's
  marker records this (``tensor_layout``), with the writer's byte order.
* :class:`DirectReader` (loading) then reads a stored chunk with one ``readinto`` into its destination when that is
  the same thing: a contiguous CPU tensor of the chunk's dtype and shape (a whole tensor, or a slice of one along
  its first dimension when the world size changed). The record's place comes from the item's zip directory
  (``zipfile``; nothing is unpickled). Everything else — a checkpoint written before the layout was recorded, a
  GPU or non-contiguous destination, a chunk cut differently, another byte order — goes through DCP's own reader.
  A damaged or hostile shard can only put wrong numbers into tensors whose dtype and shape the destination fixes
  (the marker's CRC-32s find accidents; ``verify_shards`` checks them before reading).
* :class:`DigestingWriter` (saving) is DCP's ``FileSystemWriter`` with a CRC-32 of every file taken from the bytes as
  they are written, so the checkpoint's manifest needs no second pass over the shards, and without ``torch.save``'s
  own CRC-32 of each record (a pass the manifest makes redundant).
* :class:`WeightsOnlyLoadPlanner` (loading) makes DCP's non-tensor items (optimizer ``param_groups``) go through
  the weights-only unpickler, which DCP's default planner does not use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import struct
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem, WriteItem
from torch.futures import Future

from hpcppo.rundir.checkpoints import crc32

LAYOUT = "contiguous"  # the marker's tensor_layout.order for checkpoints saved through ContiguousSavePlanner
_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # a zip local file header (30 bytes), APPNOTE 4.3.7
_LOCAL_MAGIC = 0x04034B50


class ContiguousSavePlanner(DefaultSavePlanner):
    """DCP's default save planner, except that every tensor is written contiguous (row-major)."""

    def transform_object(self, write_item: WriteItem, object: Any) -> Any:  # noqa: A002 (DCP's parameter name)
        if isinstance(object, torch.Tensor):
            object = object.contiguous()
        return super().transform_object(write_item, object)


class _Window(io.RawIOBase):
    """Bytes ``[start, start + length)`` of a seekable binary file, as a file of their own (what ``zipfile``
    needs to read one item of a ``.distcp`` file)."""

    def __init__(self, file: Any, start: int, length: int) -> None:
        super().__init__()
        self._file, self._start, self._length, self._pos = file, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._length}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self._length - self._pos))
        if n == 0:
            return 0
        self._file.seek(self._start + self._pos)
        got = self._file.readinto(memoryview(buffer)[:n])
        self._pos += got
        return got


class _DigestingStream(io.RawIOBase):
    """A binary file being written, whose size and CRC-32 follow every ``write``."""

    def __init__(self, file: Any) -> None:
        super().__init__()
        self._file = file
        self.size = 0
        self.crc = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = self._file.write(view)
        if n != len(view):  # a buffered binary file writes everything or raises
            raise OSError(f"short write to {self._file.name}: {n} of {len(view)} bytes")
        self.crc = crc32(view, self.crc)  # releases the GIL on large buffers
        self.size += n
        return n

    def tell(self) -> int:
        return self._file.tell()

    def flush(self) -> None:
        self._file.flush()

    def fileno(self) -> int:
        return self._file.fileno()


class _DigestingFileSystem(FileSystem):
    def __init__(self, digests: dict[str, tuple[int, int]], lock: threading.Lock) -> None:
        super().__init__()
        self._digests, self._lock = digests, lock

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as file:
            stream = _DigestingStream(file)
            yield stream
            with self._lock:  # DCP's writer may use several threads
                self._digests[Path(path).name] = (stream.size, stream.crc)


class DigestingWriter(FileSystemWriter):
    """``FileSystemWriter`` that records ``(size, crc32)`` of each file it writes, by file name, in ``digests``.

    DCP (torch 2.13, filesystem.py) writes every file through ``self.fs.create_stream(path, "wb")`` and only
    ``write``s, ``tell``s, ``flush``es and ``fsync``s the stream; the digest is of exactly the bytes handed to the
    file. A file that is later renamed (DCP's ``.metadata``) is recorded under the name it was written as.
    ``write_data`` skips ``torch.save``'s own CRC-32 of every record of every item (``torch.load`` does not check it;
    the manifest's CRC-32 covers the same bytes): the option is a thread-local setting in torch 2.13
    (``torch.utils._config_module``: user overrides live in a ``ContextVar``), switched off only in the thread that
    writes (the caller's, or DCP's async one; ``write_data`` returns once every shard is written) and only while it
    does. ``thread_count`` > 1 would write from threads of DCP's that keep torch's default.
    Measured in one process on one thread, 570 MB of fp32 tensors into the page cache (no fsync), 5 rounds
    interleaved: ``dcp.save`` through this writer took 0.46 s median with ``torch.save``'s CRC and zlib's digest,
    0.205 s without the one and with ISA-L's for the other; a plain ``write`` of the same bytes took 0.113 s.
    """

    def __init__(self, path: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.digests: dict[str, tuple[int, int]] = {}
        self.fs = _DigestingFileSystem(self.digests, threading.Lock())

    def write_data(self, plan: Any, planner: Any) -> Future:
        before = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(False)
        try:
            return super().write_data(plan, planner)
        finally:
            torch.serialization.set_crc32_options(before)


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, except that non-tensor items only load if the weights-only unpickler accepts them.

    DCP saves each non-tensor value of a state dict (an optimizer's ``param_groups``: floats, tuples, bools) as a
    ``torch.save`` blob, and ``DefaultLoadPlanner.load_bytes`` (torch 2.13, default_planner.py) reads it back with
    ``torch.load(weights_only=False)``: a tampered checkpoint could run code there. Here every blob is first
    unpickled with ``weights_only=True``, which refuses any global outside torch's allowlist (an
    ``UnpicklingError``: the item is damage); only bytes that passed are handed on to DCP's own placement.
    """

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        torch.load(value, weights_only=True)
        value.seek(0)
        super().load_bytes(read_item, value)


def _record_span(view: Any, nbytes: int) -> int | None:
    """Offset in the item ``view`` of its one storage record's bytes, when that record holds ``nbytes`` bytes,
    stored (not compressed); None otherwise."""
    with zipfile.ZipFile(view) as archive:
        records = [info for info in archive.infolist() if "/data/" in info.filename]
        if len(records) != 1 or records[0].compress_type != zipfile.ZIP_STORED or records[0].file_size != nbytes:
            return None
        info = records[0]
    view.seek(info.header_offset)
    header = _LOCAL_HEADER.unpack(view.read(_LOCAL_HEADER.size))
    if header[0] != _LOCAL_MAGIC:
        return None
    return info.header_offset + _LOCAL_HEADER.size + header[9] + header[10]  # + file name + extra field


class DirectReader(FileSystemReader):
    """``FileSystemReader`` whose reads of contiguous chunks land in their destination without a staging copy.

    ``direct``: the checkpoint's marker says its tensors were saved by :class:`ContiguousSavePlanner` on a machine
    of this byte order. Without it every item takes DCP's path.
    """

    def __init__(self, path: Any, *, direct: bool) -> None:
        super().__init__(path)
        self.direct = direct
        self.direct_items = 0  # tensors the last read_data read straight into their destination
        self.tensor_items = 0  # tensors it read in all

    def _direct_target(self, req: ReadItem, planner: LoadPlanner) -> torch.Tensor | None:
        if not self.direct or req.type != LoadItemType.TENSOR or any(req.storage_offsets):
            return None
        if self.storage_data[req.storage_index].transform_descriptors:
            return None
        stored = planner.metadata.state_dict_metadata.get(req.storage_index.fqn)  # type: ignore[attr-defined]
        if not isinstance(stored, TensorStorageMetadata):
            return None
        chunk = next((c for c in stored.chunks if tuple(c.offsets) == tuple(req.storage_index.offset or ())), None)
        if chunk is None or tuple(chunk.sizes) != tuple(req.lengths):  # the request is the whole stored chunk
            return None
        target = planner.resolve_tensor(req).detach()
        if (target.device.type != "cpu" or not target.is_contiguous() or target.dtype != stored.properties.dtype
                or tuple(target.shape) != tuple(req.lengths)):
            return None
        return target

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[tuple[ReadItem, torch.Tensor]]] = {}
        rest: list[ReadItem] = []
        for req in plan.items:
            target = self._direct_target(req, planner)
            if target is None:
                rest.append(req)
            else:
                per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append((req, target))
        self.direct_items = 0
        self.tensor_items = sum(req.type == LoadItemType.TENSOR for req in plan.items)
        for relative_path, reqs in per_file.items():
            with self.fs.create_stream(self.fs.concat_path(self.path, relative_path), "rb") as stream:
                for req, target in sorted(reqs, key=lambda rt: self.storage_data[rt[0].storage_index].offset):
                    if self._read_into(stream, req, target):
                        planner.commit_tensor(req, target)
                        self.direct_items += 1
                    else:
                        rest.append(req)
        if rest:
            super().read_data(dataclasses.replace(plan, items=rest), planner).wait()
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_into(self, stream: Any, req: ReadItem, target: torch.Tensor) -> bool:
        """Read the stored chunk of ``req`` into ``target``; False (nothing read) when its record is not the
        tensor's bytes alone."""
        item = self.storage_data[req.storage_index]
        nbytes = target.numel() * target.element_size()
        offset = _record_span(io.BufferedReader(_Window(stream, item.offset, item.length), 4096), nbytes)
        if offset is None or offset + nbytes > item.length:
            return False
        if nbytes == 0:
            return True
        stream.seek(item.offset + offset)
        buf = target.reshape(-1).view(torch.uint8).numpy().data  # the tensor's bytes, as a memoryview
        got = 0
        while got < nbytes:
            n = stream.readinto(buf[got:])
            if not n:
                raise OSError(f"{item.relative_path}: the file ends {nbytes - got} bytes into a tensor that should "
                              f"lie at {item.offset + offset}..{item.offset + offset + nbytes} (truncated shard)")
            got += n
        return True
