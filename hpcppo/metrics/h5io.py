"""Opening a metric log for reading with bounded HDF5 retries, and telling intact rows from lost ones.

Used by :mod:`hpcppo.metrics.reader` (``load``, ``load_events``) and by the watchdog monitor. No torch.

Why a truncated file used to block every reader. A file opened in SWMR read mode may be read while the writer
rewrites a block of metadata, so HDF5 retries a metadata read whose checksum fails: up to
``metadata_read_attempts`` times, sleeping 1 ns before the second try and twice as long before each next one.
Its default for SWMR reads is 100 tries: about 2^100 ns, forever, when the block is really missing (a
truncated file: ``pread`` returns 0 bytes, the checksum of the empty image fails, the reader sleeps, tries
again). The EOF check that rejects a truncated file at open (``truncated file: eof = ...``) is skipped in SWMR
read mode, since a file still being written may look short. :func:`open_swmr` sets 24 tries on the
file-access property list (at most ~17 ms of back-off per damaged block) through
``H5Pset_metadata_read_attempts``, which h5py does not wrap: it is called on the libhdf5 that h5py loaded.

Why a read can succeed and still be wrong. Raw data carries no checksum: a chunk whose bytes lie past the end
of a truncated file reads back as zeros (a ``seq`` of 0, a ``time`` of 0.0, metric values of 0.0), which look
like data. :func:`intact_rows` asks the chunk index where each chunk of a dataset lies and counts the rows
whose bytes are all inside the file.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import logging
import math
import os
import struct
from pathlib import Path
from typing import Any

import h5py

from hpcppo.metrics import schema

log = logging.getLogger(__name__)

METADATA_READ_ATTEMPTS = 24
#: What h5py raises when HDF5 fails on damaged metadata: an object header (KeyError), a chunk index
#: (RuntimeError), a read (OSError).
HDF5_ERRORS = (OSError, KeyError, RuntimeError)
_SIGNATURE = b"\x89HDF\r\n\x1a\n"


@functools.cache
def _hdf5_library() -> Any | None:
    """The libhdf5 that h5py loaded (its bundled copy or the system one), through ctypes."""
    with contextlib.suppress(OSError):
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1] if "/" in line else ""
                name = os.path.basename(path)
                if name.startswith("libhdf5") and not name.startswith("libhdf5_hl") and ".so" in name:
                    return ctypes.CDLL(path)
    return None


_fapl_warned = False


def file_access(locking: bool | str | None) -> h5py.h5p.PropFAID:
    """A file-access property list: bounded metadata read attempts, and file locking as ``h5py.File`` takes it
    (``True``, ``False``, ``"best-effort"``; ``None``: what ``HDF5_USE_FILE_LOCKING`` says, see
    :func:`hpcppo.metrics.schema.file_locking`)."""
    global _fapl_warned
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    if locking is None:
        locking = schema.file_locking(None).get("locking")
    if locking is not None:
        best_effort = locking == "best-effort"
        fapl.set_file_locking(bool(locking), best_effort)
    lib = _hdf5_library()
    fn = getattr(lib, "H5Pset_metadata_read_attempts", None) if lib is not None else None
    ok = False
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_int64, ctypes.c_uint], ctypes.c_int
        ok = fn(fapl.id, METADATA_READ_ATTEMPTS) >= 0
    if not ok and not _fapl_warned:
        _fapl_warned = True
        log.warning("could not limit HDF5's SWMR metadata read attempts: a truncated metric file may block reads")
    return fapl


def open_swmr(path: str | os.PathLike[str], locking: bool | str | None = None) -> h5py.File:
    """``h5py.File`` of ``path`` in SWMR read mode with a bounded metadata retry (see the module docstring).

    Works on a file still open for writing, on a closed one, and on one whose writer was killed.

    Raises:
        OSError: the file cannot be opened (missing, not HDF5, locked, its superblock unreadable).
    """
    fid = h5py.h5f.open(os.fsencode(os.fspath(path)), h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ,
                        fapl=file_access(locking))
    return h5py.File(fid)


def stored_size(path: str | os.PathLike[str]) -> int | None:
    """The end of file HDF5 recorded in the superblock (version 2 or 3, at byte 0: what ``libver="latest"``
    writes), or None when there is none to read. A file shorter than this was truncated -- unless a writer
    still has it open: its superblock may run ahead of its last write for a moment."""
    try:
        with open(path, "rb") as f:
            head = f.read(12 + 4 * 8)
    except OSError:
        return None
    if len(head) < 12 or head[:8] != _SIGNATURE or head[8] not in (2, 3):
        return None
    offset_size = head[9]
    fmt = {4: "<I", 8: "<Q"}.get(offset_size)
    if fmt is None or len(head) < 12 + 3 * offset_size:
        return None
    base, _extension, eof = (struct.unpack_from(fmt, head, 12 + i * offset_size)[0] for i in range(3))
    return base + eof


def truncation(path: str | os.PathLike[str]) -> str | None:
    """``"38000 of its 76452 bytes are left"`` when the file is shorter than its superblock records, else None."""
    stored = stored_size(path)
    try:
        size = os.stat(path).st_size
    except OSError:
        return None
    if stored is None or size >= stored:
        return None
    return f"{size} of its {stored} bytes are left"


def intact_rows(ds: h5py.Dataset, n: int, path: str | os.PathLike[str]) -> int:
    """How many of the rows ``ds[:n]`` (a chunked dataset of the file at ``path``) lie wholly inside the file.

    Rows stop at the first chunk whose entry in the chunk index cannot be read (a block of the index lost) or
    whose bytes run past the end of the file. A chunk never written reads as the fill value (an unwritten
    row, which readers drop) and counts as intact. Rows of an unfiltered chunk are contiguous, so a chunk cut
    by the end of the file keeps its rows before the cut. The file's size is taken again before a chunk
    counts as cut: a writer may have appended it since (it writes a chunk before the index entry that points
    to it).
    """
    if n <= 0:
        return 0
    rows_per_chunk, *inner = ds.chunks
    row_bytes = ds.dtype.itemsize * math.prod(inner)
    filtered = ds.id.get_create_plist().get_nfilters() > 0
    fast = _intact_rows_one_pass(ds, n, path, row_bytes, filtered)
    if fast is not None:
        return fast
    column_starts = list(itertools.product(*(range(0, extent, c) for extent, c in zip(ds.shape[1:], inner))))
    size = os.stat(path).st_size
    for start in range(0, n, rows_per_chunk):
        for columns in column_starts:
            try:
                info = ds.id.get_chunk_info_by_coord((start, *columns))
            except HDF5_ERRORS:
                return start
            if info.byte_offset is None:
                continue
            end = info.byte_offset + info.size
            if end > size:
                size = os.stat(path).st_size
            if end > size:
                whole = 0 if filtered else max(0, size - info.byte_offset) // row_bytes
                return min(n, start + whole)
    return n


def _intact_rows_one_pass(ds: h5py.Dataset, n: int, path: str | os.PathLike[str], row_bytes: int,
                          filtered: bool) -> int | None:
    """:func:`intact_rows` from one walk of the chunk index (``H5Dchunk_iter``), or None to look chunk by chunk.

    Why: ``get_chunk_info_by_coord`` costs ~0.15 ms a call (HDF5 2.0): 14 s for the 35,000 chunks of a
    1,000,000-row log, where one walk of the index takes 20 ms. A walk that fails (a block of the index lost)
    is answered chunk by chunk, which finds the first chunk whose entry cannot be read. The answer is the
    same: the rows before the first chunk cut by the end of the file, plus that chunk's whole rows.
    """
    walk = getattr(ds.id, "chunk_iter", None)
    if walk is None:
        return None
    chunks: list[tuple[int, int, int]] = []  # first row, byte offset, size

    def visit(info: Any) -> None:
        chunks.append((info.chunk_offset[0], info.byte_offset, info.size))

    try:
        walk(visit)
    except HDF5_ERRORS:
        return None
    size = os.stat(path).st_size
    cut = [c for c in chunks if c[0] < n and c[1] + c[2] > size]
    if cut:
        size = os.stat(path).st_size  # a writer may have appended those chunks since
        cut = [c for c in cut if c[1] + c[2] > size]
    kept = n
    for start, offset, _ in cut:
        whole = 0 if filtered else max(0, size - offset) // row_bytes
        kept = min(kept, start + whole)
    return kept


def describe(path: Path, exc: BaseException) -> str:
    """One line for an HDF5 failure on ``path``: h5py's message, and the truncation when there is one."""
    raw = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc  # str(KeyError) adds quotes
    text = " ".join(str(raw).split()) or type(exc).__name__
    cut = truncation(path)
    return f"truncated: {cut}; {text}" if cut else text
