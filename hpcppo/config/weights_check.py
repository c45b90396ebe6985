"""The login-node check of a model directory's safetensors files: each file's header is read and checked against the
format (safetensors' own definition: 8 bytes little-endian header length, a JSON object of tensors with ``dtype``,
``shape`` and ``data_offsets`` inside the file), no tensor is read. A file of random bytes, a truncated copy or an
index naming a shard that is not there would otherwise pass compile and fail when the job loads the model, after its
queue wait. No torch, no safetensors import.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hpcppo.errors import PathError

__all__ = ["safetensors_problem", "check_weights"]

HEADER_LENGTH_BYTES = 8
MAX_HEADER_BYTES = 100 << 20  # the safetensors library refuses larger headers too
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a readable safetensors file (from its header alone), or None."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(HEADER_LENGTH_BYTES), "little")
            if size < HEADER_LENGTH_BYTES or not 2 <= length <= min(MAX_HEADER_BYTES, size - HEADER_LENGTH_BYTES):
                return f"its first 8 bytes give a header of {length:,} bytes in a file of {size:,} (not safetensors)"
            header = json.loads(f.read(length))
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    except ValueError:  # UnicodeDecodeError and JSONDecodeError
        return "its header is not JSON (not safetensors, or damaged)"
    if not isinstance(header, dict):
        return "its header is not a JSON object (not safetensors)"
    data_bytes = size - HEADER_LENGTH_BYTES - length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_bytes):
            return f"tensor {name[:60]!r} lies outside the file's {data_bytes:,} data bytes (truncated or damaged)"
    return None


def check_weights(key: str, directory: str | os.PathLike[str]) -> None:
    """``PathError`` naming ``key`` when the safetensors checkpoint in ``directory`` (its index and every shard it
    names, or ``model.safetensors``) cannot be loaded. A directory without safetensors (``.bin``) is not checked."""
    root = Path(directory)
    index = root / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        except (OSError, ValueError, AttributeError):
            weight_map = None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise PathError(f"{key}: {index} is not a safetensors index (no weight_map of tensor -> file)")
        files = sorted(set(weight_map.values()))
    elif (root / SINGLE).exists():
        files = [SINGLE]
    else:
        return
    for name in files:
        shard = root / name
        problem = "does not exist" if not shard.is_file() else safetensors_problem(shard)
        if problem:
            raise PathError(f"{key}: {shard}: {problem}; the job could not load the model")
