"""Atomic, sharded, resumable checkpoints: DCP for models and optimizers, ``torch.save`` for the small rest.

A checkpoint ``step-<N>/`` holds

- ``dcp/`` — ``torch.distributed.checkpoint`` files: every model's and optimizer's *sharded* state, keyed by
  parameter name, so it loads on another world size (2 ranks -> 1, or onto an HSDP mesh);
- ``extra.pt`` — rank 0's ``extra`` dict (scheduler states, KL controller, data cursor, counters, watchdog state);
- ``rng-rank<r>.pt`` — each rank's RNG states (torch CPU/CUDA, Python, NumPy);
- ``COMMITTED`` — JSON written last; a directory without it does not exist as far as readers are concerned.

Protocol of ``save`` (every rank calls it): write into ``step-<N>.tmp-<hex>/``; barrier; rank 0 renames it to
``step-<N>/`` (setting an existing ``step-<N>/`` aside first, so re-saving a step after a rollback replaces it),
writes the marker atomically, fsyncs, deletes the set-aside copy; barrier; rank 0 applies retention.
A crash anywhere leaves the previous committed checkpoint as the latest.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import random
import shutil
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.optim import Optimizer

from hpcppo.distributed import layout
from hpcppo.distributed.env import all_gather_object, barrier, broadcast_object, get_rank, get_world_size
from hpcppo.errors import RunStateError

log = logging.getLogger(__name__)

EXTRA_FILE = "extra.pt"
DCP_DIR = "dcp"


def _rng_file(rank: int) -> str:
    return f"rng-rank{rank}.pt"


def check_weights_only(obj: Any, what: str = "extra") -> bytes:
    """Serialise ``obj`` with ``torch.save`` and prove it loads back with ``weights_only=True``.

    Raises ``TypeError`` naming the first offending top-level key, at save time rather than at resume time.
    """
    buf = io.BytesIO()
    torch.save(obj, buf)
    try:
        torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    except Exception as exc:  # the unpickler raises UnpicklingError or RuntimeError depending on the type
        if isinstance(obj, Mapping):
            for key, value in obj.items():
                check_weights_only(value, f"{what}[{key!r}]")  # raises, naming the deepest offending key
        raise TypeError(f"{what} cannot be loaded with torch.load(weights_only=True); store plain Python "
                        f"types and tensors (no numpy arrays or custom classes): {exc}") from None
    return buf.getvalue()


def rng_state() -> dict[str, Any]:
    """This process's RNG states as plain types and tensors (loadable with ``weights_only=True``)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency
        return state
    np_state = np.random.get_state(legacy=False)
    # weights_only refuses ndarrays: keep the MT19937 key as a uint32-valued tensor.
    np_state["state"]["key"] = torch.from_numpy(np_state["state"]["key"].astype("int64"))
    state["numpy"] = np_state
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Inverse of ``rng_state``."""
    torch.set_rng_state(state["torch"])
    random.setstate(_tuplify(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np_state = dict(state["numpy"])
        np_state["state"] = dict(np_state["state"])
        np_state["state"]["key"] = np_state["state"]["key"].numpy().astype(np.uint32)
        np.random.set_state(np_state)


def _tuplify(obj: Any) -> Any:
    # random.setstate wants tuples; a round trip through pickle keeps them, but be tolerant of lists.
    return tuple(_tuplify(x) for x in obj) if isinstance(obj, (list, tuple)) else obj


@contextlib.contextmanager
def _quiet_without_process_group() -> Iterator[None]:
    # Without a process group DCP warns that it "assumes a single process" even when told so (no_dist=True).
    with warnings.catch_warnings():
        if not dist.is_initialized():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


@contextlib.contextmanager
def _agreed(what: str) -> Iterator[None]:
    """Run a block on every rank, then raise on every rank if it failed on any (instead of a barrier).

    A rank that fails alone would otherwise leave the others waiting at the next collective until the timeout.
    """
    error = None
    try:
        yield
    except Exception as exc:  # reported to every rank below, then re-raised here with its traceback
        error = exc
    failures = [(r, e) for r, e in enumerate(all_gather_object(None if error is None else repr(error))) if e]
    if error is not None:
        raise error
    if failures:
        raise RuntimeError(f"checkpoint {what} failed on rank(s) " + "; ".join(f"{r}: {e}" for r, e in failures))


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class CheckpointManager:
    """Saves, finds, loads and prunes checkpoints under one ``root`` (``runs/<id>/checkpoints``).

    ``save`` and ``load`` are collective: every rank calls them with its own shards. The query methods are local
    and cheap. Filesystem mutations outside the checkpoint being written happen on rank 0 only. One manager (one
    job) writes a root at a time: retention runs only after this manager's save has committed.
    ``keep_last=0`` keeps every checkpoint; ``keep_last=k`` keeps the newest ``k`` committed ones.
    """

    def __init__(self, root: str | os.PathLike[str], *, keep_last: int, rank: int | None = None,
                 world_size: int | None = None):
        if keep_last < 0:
            raise ValueError(f"keep_last must be >= 0 (0 keeps all), got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last
        self.rank = get_rank() if rank is None else rank
        self.world_size = get_world_size() if world_size is None else world_size
        self._saving = False
        self.last_save_s: float | None = None
        self.last_load_s: float | None = None

    # ---------------------------------------------------------------- queries (local)
    def step_dir(self, step: int) -> Path:
        return layout.step_dir(self.root, step)

    def list_committed(self) -> list[int]:
        return layout.list_committed(self.root)

    def latest_committed(self) -> int | None:
        return layout.latest_committed(self.root)

    # ---------------------------------------------------------------- save (collective)
    def save(self, step: int, *, models: Mapping[str, nn.Module], optimizers: Mapping[str, Optimizer],
             extra: Mapping[str, Any], save_rng: bool = True) -> Path:
        """Write checkpoint ``step`` atomically and return its directory (see the module docstring).

        ``optimizers[name]`` belongs to ``models[name]``; a model without an optimizer (e.g. the reference) is
        saved alone. An optimizer that has never stepped (the actor during critic warm-up) is recorded as empty
        instead of saved: DCP would create its state with a zero-lr step, one Adam step too many for the run
        that later resumes from it (every rank has the same state keys). ``extra`` is rank 0's and must survive ``torch.load(weights_only=True)`` (checked up front, on
        every rank, so a bad value raises ``TypeError`` everywhere before any collective starts).
        """
        self._check_names(models, optimizers)
        stepped = {name: opt for name, opt in optimizers.items() if opt.state}
        final = self.step_dir(step)  # validates the step before anything is written
        extra_bytes = check_weights_only(dict(extra))
        t0 = time.perf_counter()
        self._saving = True
        try:
            token = broadcast_object(uuid.uuid4().hex if self.rank == 0 else None)
            tmp = self.root / f"step-{step}.tmp-{token}"
            if self.rank == 0:
                tmp.mkdir(parents=True)
            barrier()
            with _quiet_without_process_group():  # DCP agrees on failures across ranks by itself
                dcp.save(self._state(models, stepped), no_dist=not dist.is_initialized(),
                         storage_writer=FileSystemWriter(tmp / DCP_DIR, sync_files=True))
            with _agreed(f"writing {tmp}"):  # every rank's files are on disk before rank 0 publishes them
                if save_rng:
                    _write_durable(tmp / _rng_file(self.rank), check_weights_only(rng_state(), "rng state"))
                if self.rank == 0:
                    _write_durable(tmp / EXTRA_FILE, extra_bytes)
            with _agreed(f"committing {final}"):  # nobody returns (and maybe exits) before the commit
                if self.rank == 0:
                    self._publish(step, tmp, token, {
                        "step": step, "world_size": self.world_size, "models": sorted(models),
                        "optimizers": sorted(stepped), "empty_optimizers": sorted(set(optimizers) - set(stepped)),
                        "rng": save_rng, "time": time.time(),
                    })
        finally:
            self._saving = False
        self.last_save_s = time.perf_counter() - t0
        if self.rank == 0:
            self.prune()
        log.info("checkpoint step %d saved in %.2f s", step, self.last_save_s)
        return self.step_dir(step)

    def _publish(self, step: int, tmp: Path, token: str, marker: dict[str, Any]) -> None:
        layout.fsync_dir(tmp / DCP_DIR)
        layout.fsync_dir(tmp)
        final = self.step_dir(step)
        aside = None
        if final.exists():
            # Same step saved again (after a rollback): the old copy stays whole until the new one is in place.
            aside = self.root / f"step-{step}.old-{token}"
            os.rename(final, aside)
        os.rename(tmp, final)
        layout.fsync_dir(self.root)
        layout.write_marker(final, marker)
        if aside is not None:
            shutil.rmtree(aside)

    @staticmethod
    def _check_names(models: Mapping[str, nn.Module], optimizers: Mapping[str, Optimizer]) -> None:
        orphans = sorted(set(optimizers) - set(models))
        if orphans:
            raise ValueError(f"optimizers {orphans} have no model of the same name; models: {sorted(models)}")

    @staticmethod
    def _state(models: Mapping[str, nn.Module], optimizers: Mapping[str, Optimizer]) -> dict[str, Any]:
        """The sharded state dicts DCP reads or fills: ``{"model": {name: ...}, "optim": {name: ...}}``."""
        opts = StateDictOptions(full_state_dict=False, cpu_offload=False)
        state: dict[str, Any] = {"model": {}, "optim": {}}
        for name, model in models.items():
            if name in optimizers:
                state["model"][name], state["optim"][name] = get_state_dict(model, optimizers[name], options=opts)
            else:
                state["model"][name] = get_model_state_dict(model, options=opts)
        return state

    # ---------------------------------------------------------------- load (collective)
    def load(self, step: int, *, models: Mapping[str, nn.Module], optimizers: Mapping[str, Optimizer],
             restore_rng: bool = True) -> dict[str, Any]:
        """Load committed checkpoint ``step`` into ``models``/``optimizers`` (in place) and return ``extra``.

        Any subset of the saved models may be loaded (e.g. only the critic). The world size may differ from the
        one that saved. This rank's RNG states are restored when ``restore_rng`` and the world size is unchanged
        (with another world size there is no meaningful per-rank mapping). Raises ``RunStateError`` when ``step``
        is not committed or lacks a requested model/optimizer.
        """
        self._check_names(models, optimizers)
        path = self.step_dir(step)
        if not layout.is_committed(path):
            raise RunStateError(f"no committed checkpoint at step {step} in {self.root}; "
                                f"committed steps: {self.list_committed() or 'none'}")
        marker = layout.read_marker(path)
        empty = set(marker.get("empty_optimizers", [])) & set(optimizers)
        for kind, wanted in (("models", set(models)), ("optimizers", set(optimizers) - empty)):
            missing = sorted(wanted - set(marker.get(kind, [])))
            if missing:
                raise RunStateError(f"checkpoint {path} has no {kind} {sorted(missing)}; it holds {marker.get(kind)}")
        for name in empty:  # saved before its first step: restored as it was, without state
            optimizers[name].state.clear()
        optimizers = {name: opt for name, opt in optimizers.items() if name not in empty}
        t0 = time.perf_counter()
        state = self._state(models, optimizers)
        with _quiet_without_process_group():
            dcp.load(state, storage_reader=FileSystemReader(path / DCP_DIR), no_dist=not dist.is_initialized())
        for name, model in models.items():
            if name in optimizers:
                set_state_dict(model, optimizers[name], model_state_dict=state["model"][name],
                               optim_state_dict=state["optim"][name])
            else:
                set_model_state_dict(model, state["model"][name])
        extra = torch.load(path / EXTRA_FILE, weights_only=True)
        rng_path = path / _rng_file(self.rank)
        if restore_rng and marker.get("world_size") == self.world_size and rng_path.is_file():
            set_rng_state(torch.load(rng_path, weights_only=True))
        self.last_load_s = time.perf_counter() - t0
        log.info("checkpoint step %d loaded in %.2f s", step, self.last_load_s)
        return extra

    def abandon_after(self, step: int) -> list[int]:
        """After a rollback to ``step``: hide newer committed checkpoints from ``latest_committed`` (collective).

        Rank 0 renames them ``step-<N>.abandoned-<hex>`` (see ``layout.abandon_after``); every rank returns the
        same list of steps once the renames are durable.
        """
        moved = layout.abandon_after(self.root, step) if self.rank == 0 else None
        return broadcast_object(moved)

    # ---------------------------------------------------------------- retention (rank 0)
    def prune(self) -> list[Path]:
        """Delete committed checkpoints beyond ``keep_last`` and crash debris; return what was deleted.

        With ``keep_last > 0`` checkpoints set aside by ``abandon_after`` go too. Never deletes the newest
        committed checkpoint, never runs while this manager is saving, and does nothing on ranks other than 0.
        """
        if self._saving or self.rank != 0:
            return []
        committed = self.list_committed()
        doomed = [self.step_dir(s) for s in committed[:-self.keep_last]] if self.keep_last else []
        if self.keep_last:  # keep_last=0 keeps everything, abandoned branches included
            doomed += layout.abandoned_dirs(self.root)
        doomed += layout.stale_dirs(self.root)
        newest = self.step_dir(committed[-1]) if committed else None
        removed = []
        for path in doomed:
            if path == newest:  # belt and braces: the invariant does not depend on the slicing above
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        return removed
