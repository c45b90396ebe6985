"""Atomic, sharded, resumable checkpoints: DCP for models and optimizers, ``torch.save`` for the small rest.

A checkpoint ``step-<N>/`` holds

- ``dcp/`` — ``torch.distributed.checkpoint`` files: every model's and optimizer's *sharded* state, keyed by
  parameter name, so it loads on another world size (2 ranks -> 1, or onto an HSDP mesh);
- ``extra.pt`` — rank 0's ``extra`` dict (scheduler states, KL controller, data cursor, counters, watchdog state);
- ``rng-rank<r>.pt`` — each rank's RNG states (torch CPU/CUDA, Python, NumPy);
- ``COMMITTED`` — JSON written last; a directory without it does not exist as far as readers are concerned. It
  records every file's size and CRC-32 (each rank digests the files it wrote; rank 0 gathers them), so that damage
  after the commit is found before a checkpoint is trusted (``verify``).

Protocol of ``save`` (every rank calls it): write into ``step-<N>.tmp-<hex>/``; barrier; rank 0 renames it to
``step-<N>/`` (setting an existing ``step-<N>/`` aside first, so re-saving a step after a rollback replaces it),
writes the marker atomically, fsyncs, deletes the set-aside copy; barrier; rank 0 applies retention.
A crash anywhere leaves the previous committed checkpoint as the latest.

Background saves (``save(..., background=True)``, ``checkpoint.async_save``). The caller waits only for the
staging: ``dcp.async_save`` copies every tensor of the state into new CPU tensors before it returns (the writer is
a ``FileSystemWriter``, hence a ``BlockingAsyncStager``, and its ``stage`` is ``_create_cpu_state_dict`` +
``_copy_state_dict``: torch 2.13 ``torch/distributed/checkpoint/state_dict_saver.py`` ``async_save`` and
``staging.py`` ``BlockingAsyncStager.stage``), so the training step that follows may update the weights and the
optimizer in place. RNG states and ``extra`` are serialised before it returns too. The returned DCP future
resolves once ``save`` has run in DCP's writer thread: every rank's shards and ``.metadata`` written and, with
``sync_files``, fsynced (``filesystem.py`` ``_write_files_from_queue`` and ``finish``). A thread of this manager then
writes the small files, gathers the manifests and commits exactly as the synchronous path does. Every collective
of that thread and of DCP's (the plan exchange) runs on a second gloo process group made for checkpoints only:
collectives issued from two threads on one group could interleave and pair one rank's plan exchange with another
rank's training all-reduce. At most one save is in flight: the next ``save``, ``load``, ``verify``,
``abandon_after``, ``set_aside`` and ``wait`` first wait for it and re-raise its failure (``failed_step`` names its
step); the queries (``latest_committed``, ``list_committed``) wait for it too but leave the failure to be raised by
the next of those (the trainer handles failures where it calls ``save``). A kill during the background write leaves
``step-<N>.tmp-*`` without a marker: the previous committed checkpoint stays the newest, and retention removes the
debris later.

Damage. ``load`` checks every file's size and the small files' CRC-32 first (``verify``), and turns a file that
cannot be read into ``CorruptCheckpointError`` naming it — on every rank alike, so that all ranks take the same
decision. ``load_newest_intact`` (resume) also checks the shards' CRC-32 and falls back to the previous committed
checkpoint, setting the damaged ones aside once an older one has loaded.

The parts of a checkpoint (file names, RNG states, reading them back, one verdict for all ranks) are in
:mod:`hpcppo.distributed.checkpoint_io`.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.optim import Optimizer

from hpcppo.distributed import dcp_io
from hpcppo.distributed.checkpoint_io import (DCP_DIR, EXTRA_FILE, agreed, check_weights_only, gather, is_shard, owner,
                                              quiet_without_process_group, read_dcp, read_small, rng_file, rng_state,
                                              set_rng_state)
from hpcppo.distributed.checkpoint_io import write_durable  # looked up here: tests replace it
from hpcppo.distributed.env import barrier, broadcast_object, get_rank, get_world_size
from hpcppo.errors import RunStateError
from hpcppo.fsutil import fsync_dir
from hpcppo.rundir import checkpoints as layout
from hpcppo.rundir.checkpoints import CorruptCheckpointError

log = logging.getLogger(__name__)

_WORKER_PREFIX = "hpcppo-checkpoint"  # the thread that commits background saves


class NoIntactCheckpointError(RunStateError):
    """Every committed checkpoint is damaged: resuming would silently throw the run's progress away."""

    def __init__(self, root: Path, damaged: list[CorruptCheckpointError]):
        self.damaged = damaged
        listed = "; ".join(f"step {e.step}: {e.file}: {e.reason}" for e in damaged[:3])
        more = f"; {len(damaged) - 3} more" if len(damaged) > 3 else ""
        super().__init__(f"no intact checkpoint to resume from in {root} ({listed}{more}); nothing was moved: "
                         f"repair or remove the damaged checkpoints, or move {root} aside to start again from step 0")


class Resumed(NamedTuple):
    step: int
    extra: dict[str, Any]
    damaged: list[CorruptCheckpointError]  # newer checkpoints found damaged and set aside, newest first


class _SaveJob(NamedTuple):
    """What the commit of one save needs, all of it captured when ``save`` was called."""

    step: int
    tmp: Path
    token: str
    extra_bytes: bytes | None  # rank 0's
    rng_bytes: bytes | None
    marker: dict[str, Any]  # without "files": the manifest is gathered once the files are written
    started: float  # time.perf_counter() when save was called
    written: dict[str, tuple[int, int]]  # (size, crc32) of each DCP file as this rank wrote it, filled by DCP's write


class CheckpointManager:
    """Saves, finds, loads and prunes checkpoints under one ``root`` (``runs/<id>/checkpoints``).

    ``save`` and ``load`` are collective: every rank calls them with its own shards. The query methods are local
    and cheap (they wait for a background save in flight). Filesystem mutations outside the checkpoint being written
    happen on rank 0 only. One manager (one job) writes a root at a time: retention runs only after this manager's
    save has committed. ``keep_last=0`` keeps every checkpoint; ``keep_last=k`` keeps the newest ``k`` committed ones.
    ``timeout_s`` bounds each collective of a background save (on its own process group); None: the default
    group's timeout (the job's ``collective_timeout_s``).
    """

    def __init__(self, root: str | os.PathLike[str], *, keep_last: int, rank: int | None = None,
                 world_size: int | None = None, timeout_s: float | None = None):
        if keep_last < 0:
            raise ValueError(f"keep_last must be >= 0 (0 keeps all), got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last
        self.rank = get_rank() if rank is None else rank
        self.world_size = get_world_size() if world_size is None else world_size
        self.timeout_s = timeout_s
        self._saving = False
        self._pending: Future[None] | None = None  # the background save in flight
        self._pending_step: int | None = None
        self._error: tuple[int | None, BaseException] | None = None  # a background save's, until wait raises it
        self.failed_step: int | None = None  # the step of the background save whose failure wait last raised
        self._worker: ThreadPoolExecutor | None = None
        self._group: Any = None  # the checkpoint-only gloo process group of background saves
        self.last_save_s: float | None = None  # call to commit (for a background save: measured when it commits)
        self.last_blocking_s: float | None = None  # call to return: what the training loop waited for
        self.last_checksum_s: float | None = None  # of the last save: the manifest entries of this rank's DCP files
        self.last_load_s: float | None = None
        self.last_load_direct: tuple[int, int] = (0, 0)  # of the last load: (tensors read in place, tensors read)

    # ---------------------------------------------------------------- queries (local)
    def step_dir(self, step: int) -> Path:
        return layout.step_dir(self.root, step)

    def list_committed(self) -> list[int]:
        self._settle()
        return layout.list_committed(self.root)

    def latest_committed(self) -> int | None:
        self._settle()
        return layout.latest_committed(self.root)

    @property
    def pending_step(self) -> int | None:
        """The step of the background save in flight (None when none is)."""
        return self._pending_step if self._pending is not None else None

    def wait(self) -> None:
        """Block until the background save in flight (if any) has committed; re-raise its failure (once), on every
        rank alike (its thread agreed on failures like the synchronous path). ``failed_step`` then names its step.
        A no-op from that thread itself."""
        self._settle()
        (self.failed_step, error), self._error = self._error or (None, None), None
        if error is not None:
            raise error

    def _settle(self) -> None:
        """Wait for the background save in flight; keep its failure for the next ``wait`` or ``save`` to raise.
        The queries only settle: what is committed is the truth either way, and the failure is raised where the
        caller handles save failures (the trainer wraps ``save``, not its queries)."""
        pending = self._pending
        if pending is None or threading.current_thread().name.startswith(_WORKER_PREFIX):
            return
        self._pending = None
        try:
            pending.result()
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            self._error = (self._pending_step, exc)
            log.error("background checkpoint of step %s failed: %s", self._pending_step, layout.one_line(exc))

    # ---------------------------------------------------------------- save (collective)
    def save(self, step: int, *, models: Mapping[str, nn.Module], optimizers: Mapping[str, Optimizer],
             extra: Mapping[str, Any], save_rng: bool = True, background: bool = False) -> Path:
        """Write checkpoint ``step`` atomically and return its directory (see the module docstring).

        With ``background`` it returns once the state is staged (copied to host memory) and the write and the
        commit go on in a thread: the directory returned is committed only after ``wait`` (or the next save or
        query) returns. A save in flight is waited for first, whatever ``background`` says.

        ``optimizers[name]`` belongs to ``models[name]``; a model without an optimizer (e.g. the reference) is
        saved alone. An optimizer that has never stepped (the actor during critic warm-up) is recorded as empty
        instead of saved: DCP would create its state with a zero-lr step, one Adam step too many for the run
        that later resumes from it (every rank has the same state keys). ``extra`` is rank 0's and must survive ``torch.load(weights_only=True)`` (checked up front, on
        every rank, so a bad value raises ``TypeError`` everywhere before any collective starts).
        """
        self.wait()
        self._check_names(models, optimizers)
        stepped = {name: opt for name, opt in optimizers.items() if opt.state}
        final = self.step_dir(step)  # validates the step before anything is written
        extra_bytes = check_weights_only(dict(extra))
        t0 = time.perf_counter()
        self._saving = True
        try:
            token = broadcast_object(uuid.uuid4().hex if self.rank == 0 else None)
            tmp = layout.tmp_dir(self.root, step, token)
            if self.rank == 0:
                tmp.mkdir(parents=True)
            barrier()
            writer = dcp_io.DigestingWriter(tmp / DCP_DIR, sync_files=True)
            job = _SaveJob(step, tmp, token, extra_bytes if self.rank == 0 else None,
                           check_weights_only(rng_state(), "rng state") if save_rng else None,
                           {"step": step, "world_size": self.world_size, "models": sorted(models),
                            "optimizers": sorted(stepped), "empty_optimizers": sorted(set(optimizers) - set(stepped)),
                            "rng": save_rng, "tensor_layout": {"order": dcp_io.LAYOUT, "byteorder": sys.byteorder}},
                           t0, writer.digests)
            state = self._state(models, stepped)
            upload: Future[Any] | None = None
            with quiet_without_process_group():  # DCP agrees on failures across ranks by itself
                if background:  # returns once `state` is copied to new CPU tensors (module docstring)
                    upload = cast(Future[Any], dcp.async_save(  # a Future with DCP's default stager
                        state, storage_writer=writer, planner=dcp_io.ContiguousSavePlanner(),
                        process_group=self._background_group(), no_dist=not dist.is_initialized()))
                else:
                    dcp.save(state, storage_writer=writer, planner=dcp_io.ContiguousSavePlanner(),
                             no_dist=not dist.is_initialized())
        except BaseException:
            self._saving = False
            raise
        if upload is None:
            self._commit(job, None, None)
            self.last_blocking_s = time.perf_counter() - t0
        else:
            self.last_blocking_s = time.perf_counter() - t0
            if self._worker is None:
                self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=_WORKER_PREFIX)
            self._pending = self._worker.submit(self._commit, job, upload, self._group)
            self._pending_step = step
        return final

    def _background_group(self) -> Any:
        """The gloo group of background saves, made at the first one (``new_group`` is collective, as is ``save``).
        None without a process group."""
        if self._group is None and dist.is_initialized():
            self._group = dist.new_group(backend="gloo", timeout=self._timeout())
        return self._group

    def _timeout(self) -> timedelta:
        if self.timeout_s is not None:
            return timedelta(seconds=self.timeout_s)
        try:  # the default group's own timeout; private in torch 2.13 (ProcessGroupGloo.options._timeout)
            return dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).options._timeout
        except Exception:  # no CPU backend on the default group (NCCL only): torch's default for gloo groups
            return timedelta(minutes=30)

    def _commit(self, job: _SaveJob, upload: Future[Any] | None, group: Any) -> None:
        """Everything after DCP's write: this rank's small files and digests, the manifest, rank 0's publication,
        retention. Runs in the caller's thread (synchronous save, ``group`` None: the default group) or in this
        manager's worker (background: after ``upload``, DCP's future, and on the checkpoint-only ``group``)."""
        step, tmp = job.step, job.tmp
        try:
            if upload is not None:
                upload.result()  # DCP's CheckpointException when any rank failed: raised on every rank
            with agreed(f"writing {tmp}", group):  # every rank's files are on disk before rank 0 publishes them
                files = self._write_own_files(tmp, job.extra_bytes, job.rng_bytes, job.written)
            manifest = {name: record for part in gather(files, group) for name, record in part.items()}
            with agreed(f"committing {self.step_dir(step)}", group):  # nobody returns before the commit
                if self.rank == 0:
                    self._publish(step, tmp, job.token,
                                  job.marker | {"time": time.time(), "files": dict(sorted(manifest.items()))})
        finally:
            self._saving = False
        self.last_save_s = time.perf_counter() - job.started
        if self.rank == 0:
            self.prune()
        log.info("checkpoint step %d saved in %.2f s%s (checksums of this rank's shards: %.2f s)", step,
                 self.last_save_s, "" if upload is None else f", {self.last_blocking_s:.2f} s of it blocking",
                 self.last_checksum_s)

    def _write_own_files(self, tmp: Path, extra_bytes: bytes | None, rng_bytes: bytes | None,
                         written: Mapping[str, tuple[int, int]]) -> dict[str, dict[str, Any]]:
        """Write this rank's small files; return the manifest entries of every file this rank wrote.

        The small files are digested from the bytes in memory, the DCP shards from the bytes DCP wrote (``written``,
        by file name, from :class:`~hpcppo.distributed.dcp_io.DigestingWriter`) when the file on disk has that
        size; any other file of this rank (DCP's ``.metadata``, renamed after it was written) is read back.
        """
        files = {}
        if rng_bytes is not None:
            write_durable(tmp / rng_file(self.rank), rng_bytes)
            files[rng_file(self.rank)] = layout.file_record(rng_bytes)
        if extra_bytes is not None:
            write_durable(tmp / EXTRA_FILE, extra_bytes)
            files[EXTRA_FILE] = layout.file_record(extra_bytes)
        t0 = time.perf_counter()
        for entry in sorted((tmp / DCP_DIR).iterdir()):
            name = f"{DCP_DIR}/{entry.name}"
            if entry.is_file() and owner(name, self.world_size) == self.rank:
                seen = written.get(entry.name)
                if seen is not None and seen[0] == entry.stat().st_size:
                    files[name] = layout.digest_record(*seen)
                else:
                    files[name] = layout.file_digest(entry)
        self.last_checksum_s = time.perf_counter() - t0
        return files

    def _publish(self, step: int, tmp: Path, token: str, marker: dict[str, Any]) -> None:
        fsync_dir(tmp / DCP_DIR)
        fsync_dir(tmp)
        final = self.step_dir(step)
        aside = None
        if final.exists():
            # Same step saved again (after a rollback): the old copy stays whole until the new one is in place.
            aside = layout.set_aside(self.root, step, "old", token)
        os.rename(tmp, final)
        fsync_dir(self.root)
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

    # ---------------------------------------------------------------- verify and load (collective)
    def verify(self, step: int, *, shards: bool = False) -> dict[str, Any]:
        """Check committed checkpoint ``step`` against the manifest its commit recorded (collective); return its
        marker.

        Every file's size is compared (a ``stat``), and the CRC-32 of ``extra.pt``, the RNG files and DCP's
        ``.metadata`` (kilobytes); the shards' CRC-32 (a read of every shard) only with ``shards``. Each rank checks
        the files its rank wrote, so the reads run in parallel. Raises ``CorruptCheckpointError`` naming the file,
        on every rank alike. Files the manifest does not list are ignored; a checkpoint written before manifests
        existed passes.
        """
        self.wait()
        path = self._committed_dir(step)
        with agreed(f"verifying {path}"):
            marker = self._marker(path)
            files = marker.get("files") or {}
            for name in sorted(files):
                if owner(name, self.world_size) == self.rank:
                    why = layout.check_file(path, name, files[name], checksum=shards or not is_shard(name))
                    if why is not None:
                        raise CorruptCheckpointError(path, name, why)
        return marker

    def load(self, step: int, *, models: Mapping[str, nn.Module], optimizers: Mapping[str, Optimizer],
             restore_rng: bool = True, verify_shards: bool = False) -> dict[str, Any]:
        """Load committed checkpoint ``step`` into ``models``/``optimizers`` (in place) and return ``extra``.

        Any subset of the saved models may be loaded (e.g. only the critic). The world size may differ from the
        one that saved. This rank's RNG states are restored when ``restore_rng`` and the world size is unchanged
        (with another world size there is no meaningful per-rank mapping). Raises ``RunStateError`` when ``step``
        is not committed or lacks a requested model/optimizer, and ``CorruptCheckpointError`` (on every rank) when
        ``verify`` (shards' checksums with ``verify_shards``) finds damage or a file cannot be read.
        """
        self._check_names(models, optimizers)
        marker = self.verify(step, shards=verify_shards)  # raises first when step is not committed
        path = self.step_dir(step)
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
        direct = marker.get("tensor_layout") == {"order": dcp_io.LAYOUT, "byteorder": sys.byteorder}
        rng = None
        with agreed(f"loading {path}"):  # every file is read rank by rank; one verdict for all of them
            self.last_load_direct = read_dcp(state, path, direct=direct)
            extra = read_small(path, EXTRA_FILE)
            rng_path = path / rng_file(self.rank)
            if restore_rng and marker.get("world_size") == self.world_size and rng_path.is_file():
                rng = read_small(path, rng_path.name)
        for name, model in models.items():
            if name in optimizers:
                set_state_dict(model, optimizers[name], model_state_dict=state["model"][name],
                               optim_state_dict=state["optim"][name])
            else:
                set_model_state_dict(model, state["model"][name])
        if rng is not None:
            set_rng_state(rng)
        self.last_load_s = time.perf_counter() - t0
        log.info("checkpoint step %d loaded in %.2f s (%d of this rank's %d tensors read in place)", step,
                 self.last_load_s, *self.last_load_direct)
        return extra

    def load_newest_intact(self, *, models: Mapping[str, nn.Module],
                           optimizers: Mapping[str, Optimizer]) -> Resumed | None:
        """Resume: load the newest committed checkpoint that verifies (shards' checksums included) and loads.

        Damaged newer ones are set aside (``set_aside``) once an older one has loaded, and returned. None when
        nothing is committed. Raises ``NoIntactCheckpointError`` when every committed checkpoint is damaged, and
        then moves nothing: a run that silently started again at step 0 would lose its progress unnoticed.
        """
        self.wait()
        damaged: list[CorruptCheckpointError] = []
        damaged_steps: list[int] = []
        committed = broadcast_object(self.list_committed() if self.rank == 0 else None)  # one list for all ranks
        for step in reversed(committed):
            try:
                extra = self.load(step, models=models, optimizers=optimizers, verify_shards=True)
            except CorruptCheckpointError as exc:
                damaged.append(exc)
                damaged_steps.append(step)
                continue
            for bad, bad_step in zip(damaged, damaged_steps):
                bad.set_aside_as = self.set_aside(bad_step)
            return Resumed(step, extra, damaged)
        if damaged:
            raise NoIntactCheckpointError(self.root, damaged)
        return None

    def set_aside(self, step: int) -> Path:
        """Hide damaged committed checkpoint ``step`` as ``step-<N>.corrupt-<hex>`` (collective; rank 0 renames).

        Kept for a post-mortem: retention never deletes it. Every rank returns the new path.
        """
        self.wait()
        return Path(broadcast_object(str(layout.set_aside_corrupt(self.root, step)) if self.rank == 0 else None))

    def _committed_dir(self, step: int) -> Path:
        path = self.step_dir(step)
        if not layout.is_committed(path):
            raise RunStateError(f"no committed checkpoint at step {step} in {self.root}; "
                                f"committed steps: {self.list_committed() or 'none'}")
        return path

    @staticmethod
    def _marker(path: Path) -> dict[str, Any]:
        try:
            marker = layout.read_marker(path)
        except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise CorruptCheckpointError(path, layout.MARKER, f"unreadable ({layout.one_line(exc)})") from exc
        if not isinstance(marker, dict):
            raise CorruptCheckpointError(path, layout.MARKER, f"not a JSON object but {type(marker).__name__}")
        return marker

    def abandon_after(self, step: int) -> list[int]:
        """After a rollback to ``step``: hide newer committed checkpoints from ``latest_committed`` (collective).

        Rank 0 renames them ``step-<N>.abandoned-<hex>`` (see ``layout.abandon_after``); every rank returns the
        same list of steps once the renames are durable.
        """
        self.wait()
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
        committed = layout.list_committed(self.root)  # not self.list_committed(): it may run in the save's thread
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
