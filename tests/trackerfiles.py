"""Readers of the trackers' files for the tests: TensorBoard's own reader, and wandb's offline run format."""

from __future__ import annotations

import struct
from pathlib import Path


def tensorboard_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in ``logdir``, as TensorBoard's own reader loads it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def wandb_records(run_file: Path) -> list:
    """The records of a wandb offline run file (``run-<id>.wandb``): wandb's header (``:W&B``, magic 0xBEE1,
    version 0), then LevelDB log blocks of 32 KiB holding ``wandb_internal_pb2.Record`` protobufs."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0)
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0 and length == 0:
            break
        pending += chunk
        if kind in (1, 4):  # FULL or LAST: a whole record
            r = wandb_internal_pb2.Record()
            r.ParseFromString(pending)
            records.append(r)
            pending = b""
    return records
