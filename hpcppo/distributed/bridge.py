"""The bridge of split placement: trainer rank 0 and every rollout rank, on a store and a process group of their own.

In split placement (docs/placement.md) the trainer ranks' default process group is the FSDP world, and the rollout
ranks are not in it. The bridge joins trainer rank 0 (bridge rank 0) and the R rollout ranks (bridge ranks 1..R)
without touching the default group: rank 0 hosts a ``torch.distributed.TCPStore`` on its own port, and every rank
builds the backend object directly on a ``PrefixStore`` of it, as ``init_process_group`` does for a group but without
registering anything in ``torch.distributed``'s world (torch 2.13, torch/distributed/distributed_c10d.py,
``_new_process_group_helper``: ``ProcessGroupGloo(backend_prefix_store, group_rank, group_size, timeout=timeout)``
and ``ProcessGroupNCCL(backend_prefix_store, group_rank, group_size, backend_options)`` with
``ProcessGroupNCCL.Options()``, ``is_high_priority_stream = False`` and ``_timeout``; the bindings are in
torch/csrc/distributed/c10d/init.cpp: ``ProcessGroupGloo(store, rank, size, timeout)`` and
``ProcessGroupNCCL(store, rank, size, options)``; ``TCPStore(host_name, port, world_size, is_master, timeout,
wait_for_workers, ...)`` and ``PrefixStore(prefix, store)``). Collectives are called on that backend object
(``backend.broadcast([tensor], BroadcastOptions)``), so nothing here depends on the default group existing or on
its world. The NCCL path is the gloo path with another constructor and the buffers on the current CUDA device; only
the gloo path runs on this machine.

What goes over it:

- weights, rank 0 to all (:meth:`Bridge.broadcast_weights` / :meth:`Bridge.receive_weights`): bucketed per dtype
  (:mod:`hpcppo.distributed.bridge_buckets`), each bucket's manifest (names, shapes, dtype, offsets) written to the
  store before its bytes are broadcast; the receiver yields views of buffers it never reuses, which an engine loads
  in place, and a tensor larger than a bucket straight into the engine's own tensor when one is offered (``into``).
  Every broadcast carries a policy version.
- small objects, over the store only (never the collective path): :meth:`Bridge.send_obj` from a rollout rank to
  rank 0 (:meth:`Bridge.poll_obj`, :meth:`Bridge.recv_any`), :meth:`Bridge.notify_all` from rank 0 to every rollout
  rank (:meth:`Bridge.poll_notice`). A value is pickled and cut into pieces under the store's payload limit.

Every wait is bounded: a peer that does not come ends it in a one-line :class:`BridgeTimeout` naming that peer.
:meth:`Bridge.close` frees the group, the store (and rank 0's server thread) and every buffer.
"""

from __future__ import annotations

import datetime
import itertools
import pickle
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import BroadcastOptions

from hpcppo.distributed.bridge_buckets import (
    BucketHead,
    OpenBucket,
    as_bytes,
    capacity,
    single_head,
)

# Same default as iter_full_params' gathers (hpcppo.distributed.weights.DEFAULT_BUCKET_BYTES): large enough that a
# bucket's fixed costs (a store round trip, a collective's start) vanish, small enough to stay out of fresh-page
# faults. tools/bench_weight_broadcast.py measures it against one broadcast of all the bytes.
DEFAULT_BUCKET_BYTES = 8 << 20
DEFAULT_TIMEOUT_S = 600.0
# The libuv TCPStore refuses a value over 8 MiB ("Invalid payload size ... max: 8388608",
# torch/csrc/distributed/c10d/TCPStoreLibUvBackend.cpp, torch 2.13): larger objects travel in pieces of this size.
PIECE_BYTES = 4 << 20
# How long rank 0 waits, in close(), for the rollout ranks to have closed before it stops the store they talk to.
CLOSE_WAIT_S = 30.0
# How long rank 0 keeps the store up after a failed join for the members that came to read who did not.
JOIN_ACK_S = 10.0
_IN_FLIGHT = 2  # sender buckets in flight at once (the next one is packed while they go)

Backend = Literal["gloo", "nccl"]


class BridgeTimeout(TimeoutError):
    """A peer of the bridge did not come within the wait's timeout; the message is one line naming it."""


class BridgeError(RuntimeError):
    """The bridge used the wrong way (a rollout rank broadcasting, a closed bridge)."""


@dataclass(frozen=True)
class BroadcastStats:
    """One weight broadcast as rank 0 saw it: ``bytes`` of tensors in ``buckets`` collectives over ``seconds``
    (from the call to the last bucket sent, gathering time of a streamed source included), of which ``waited``
    went by before the first byte, until every rollout rank called :meth:`Bridge.receive_weights` (a rollout rank
    still generating)."""

    version: int
    tensors: int
    bytes: int
    buckets: int
    seconds: float
    waited: float = 0.0

    @property
    def gbps(self) -> float:
        """Bytes per second of the transfer itself (the wait for the receivers excluded)."""
        moving = self.seconds - self.waited
        return self.bytes / moving / 1e9 if moving > 0 else 0.0


def _peers(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    if ranks == [0]:
        return "rank 0 (the trainer)"
    return ("rollout rank " if len(ranks) == 1 else "rollout ranks ") + ", ".join(map(str, ranks))


class Bridge:
    """One process's end of the bridge. Build it with :meth:`connect` on every member (rank 0 first or not: each
    waits for the others up to ``timeout_s``); use it from one thread."""

    def __init__(self, *, addr: str, port: int, rank: int, size: int, backend: Backend, timeout_s: float,
                 bucket_bytes: int, store: dist.TCPStore, group: Any, device: torch.device) -> None:
        self.addr, self.port, self.rank, self.size = addr, port, rank, size
        self.backend, self.timeout_s, self.bucket_bytes = backend, timeout_s, bucket_bytes
        self.device = device
        self._store: dist.TCPStore | None = store
        self._group: Any = group
        self._seq = 0  # broadcasts done (sender) or taken (receiver)
        self._last_buckets = 0  # buckets of the previous broadcast (sender: its keys are deleted at the next one)
        self._pools: dict[torch.dtype, list[tuple[torch.Tensor, Any]]] = {}  # per dtype: two (buffer, work)
        self._turn: dict[torch.dtype, int] = {}
        self._open_receive: Iterator[tuple[str, torch.Tensor]] | None = None
        self._messages = itertools.count()
        self._inbox: deque[tuple[int, Any]] = deque()

    # ------------------------------------------------------------------ set-up and tear-down
    @classmethod
    def connect(cls, addr: str, port: int, rank: int, size: int, *, backend: Backend = "gloo",
                timeout_s: float = DEFAULT_TIMEOUT_S, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Bridge:
        """Join the bridge at ``addr:port`` as ``rank`` of ``size`` (rank 0, the trainer's rank 0, hosts the store
        there; ranks 1..size-1 are the rollout ranks). Returns once all ``size`` members have joined and the process
        group is up; a member missing after ``timeout_s`` fails every other with :class:`BridgeTimeout` naming it.
        ``backend="nccl"``: set the rank's CUDA device first (the buffers and the communicator use the current one).
        A bridge that raised :class:`BridgeTimeout` is out of step with its peers: close it."""
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"bridge backend {backend!r}: allowed 'gloo', 'nccl'")
        if size < 2 or not 0 <= rank < size:
            raise ValueError(f"bridge rank {rank} of {size}: needs 0 <= rank < size and size >= 2 (a sender and at "
                             "least one rollout rank)")
        if bucket_bytes < 1 or timeout_s <= 0:
            raise ValueError(f"bridge bucket_bytes {bucket_bytes} and timeout_s {timeout_s} must be positive")
        where = f"bridge {addr}:{port} rank {rank}/{size}"
        td = datetime.timedelta(seconds=timeout_s)
        try:
            store = dist.TCPStore(addr, port, size, rank == 0, td, wait_for_workers=False)
        except (RuntimeError, OSError) as exc:
            reason = _first_line(exc)
            if rank == 0:
                raise BridgeError(f"{where}: cannot host the bridge's store: {reason}") from None
            raise BridgeTimeout(f"{where}: rank 0 (the trainer) is not reachable at {addr}:{port} within "
                                f"{timeout_s:g} s ({reason})") from None
        missing = _join(store, rank, size, timeout_s)
        if missing:
            del store  # rank 0: the server thread and the port go now, not with the exception's frames
            raise BridgeTimeout(f"{where}: {_peers(missing)} did not join within {timeout_s:g} s")
        group_store = dist.PrefixStore("group/", store)
        if backend == "nccl":
            if not dist.is_nccl_available():
                raise BridgeError(f"{where}: backend 'nccl' asked for, but this torch has no NCCL")
            device = torch.device("cuda", torch.cuda.current_device())
            options = dist.ProcessGroupNCCL.Options()
            options.is_high_priority_stream = False
            options._timeout = td
            group: Any = dist.ProcessGroupNCCL(group_store, rank, size, options)
        else:
            device = torch.device("cpu")
            group = dist.ProcessGroupGloo(group_store, rank, size, td)
        return cls(addr=addr, port=port, rank=rank, size=size, backend=backend, timeout_s=timeout_s,
                   bucket_bytes=bucket_bytes, store=store, group=group, device=device)

    @property
    def closed(self) -> bool:
        return self._store is None

    def close(self, *, wait_s: float = CLOSE_WAIT_S) -> None:
        """Leave the bridge and free everything it holds: buffers, the process group (its threads and connections),
        the store (rank 0: its server). Rank 0 first waits up to ``wait_s`` for the rollout ranks to have closed, so
        that none loses the store while it still talks to it. Safe to call twice."""
        store = self._store
        if store is None:
            return
        try:
            _put(store, f"closed/{self.rank}", b"1")
            if self.rank == 0:
                store.wait([f"closed/{r}" for r in range(1, self.size)], datetime.timedelta(seconds=wait_s))
        except (RuntimeError, OSError):  # a peer died or never closed: leaving is all there is left to do
            pass
        self._open_receive = None
        self._pools.clear()
        self._inbox.clear()
        group, self._group, self._store = self._group, None, None
        try:
            group.shutdown()
        except (RuntimeError, AttributeError):
            pass
        del group, store

    def __enter__(self) -> Bridge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ weights
    def broadcast_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, *,
                          timeout_s: float | None = None) -> BroadcastStats:
        """Send ``named_tensors`` (streamed: e.g. ``iter_full_params(actor)``, consumed once) as policy ``version`` to
        every rollout rank; rank 0 only. Waits up to ``timeout_s`` (the bridge's by default) for every rollout rank to
        call :meth:`receive_weights`, naming the ones that did not. A tensor must stay unchanged until this returns
        (one larger than a bucket is sent from its own memory)."""
        store = self._need(sender=True)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        start = time.perf_counter()
        n = self._seq + 1
        _set(store, f"w/{n}/head", {"version": int(version)})
        receivers = range(1, self.size)
        _wait_keys(store, [f"w/{n}/ready/{r}" for r in receivers], timeout,
                   lambda missing: f"{self._where()}: {_peers(missing)} did not take weights version {version} "
                                   f"within {timeout:g} s")
        waited = time.perf_counter() - start
        self._forget(n - 1)
        self._seq = n
        in_flight: deque[tuple[Any, torch.Tensor, int]] = deque()  # (work, its buffer, bucket index)
        opened: dict[torch.dtype, OpenBucket] = {}
        tensors = sent = 0
        buckets = 0

        def send(head: BucketHead, flat: torch.Tensor) -> None:
            nonlocal buckets, sent
            while len(in_flight) >= _IN_FLIGHT:
                work, _, k = in_flight.popleft()
                self._wait(work, timeout, f"{_peers(receivers)} did not all receive bucket {k} of weights version "
                                          f"{version}")
            _set(store, f"w/{n}/b/{buckets}", head)
            if head.numel:
                work = self._broadcast(flat[:head.numel])
                in_flight.append((work, flat, buckets))
                if not head.single:
                    self._pools[flat.dtype][self._turn[flat.dtype]] = (flat, work)
            buckets += 1
            sent += head.numel * flat.element_size()

        for name, tensor in named_tensors:
            t = tensor.detach()
            tensors += 1
            if t.numel() * t.element_size() > self.bucket_bytes:
                send(single_head(name, t), t.to(self.device).contiguous().view(-1))
                continue
            bucket = opened.get(t.dtype)
            if bucket is not None and not bucket.fits(t.numel()):
                send(bucket.head(), bucket.buffer)
                bucket = None
            if bucket is None:
                bucket = opened[t.dtype] = OpenBucket(self._take_buffer(t.dtype, 0, timeout))
            bucket.add(name, t)
        for bucket in opened.values():
            send(bucket.head(), bucket.buffer)
        _set(store, f"w/{n}/b/{buckets}", None)  # the end of the manifest
        self._last_buckets = buckets + 1
        while in_flight:
            work, _, k = in_flight.popleft()
            self._wait(work, timeout, f"{_peers(receivers)} did not all receive bucket {k} of weights version "
                                      f"{version}")
        return BroadcastStats(version=int(version), tensors=tensors, bytes=sent, buckets=buckets,
                              seconds=time.perf_counter() - start, waited=waited)

    def pending_weights(self) -> int | None:
        """The version rank 0 is broadcasting and this rollout rank has not taken yet, or None (non-blocking)."""
        store = self._need(sender=False)
        key = f"w/{self._seq + 1}/head"
        return _get(store, key)["version"] if store.check([key]) else None

    def receive_weights(
        self, *, timeout_s: float | None = None, into: Mapping[str, torch.Tensor] | None = None,
    ) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
        """Take rank 0's next weight broadcast (rollout ranks): ``(version, iterator of (name, tensor))``, waiting up
        to ``timeout_s`` for it to start. Every tensor comes once, with its name, shape and dtype as sent, on this
        bridge's device: a view of its bucket's buffer, which is never reused (it lives as long as a view of it
        does), so a consumer may hold several before loading them (vLLM's engine groups them in buckets) and a
        load in place (``engine.sync_weights``, ``load_into``) copies each once. A tensor larger than a bucket whose
        entry in ``into`` (e.g. the engine's own parameters) is contiguous, of its shape, dtype and device is
        received straight into that entry, which is what is yielded. Consume the iterator to the end: the broadcast
        is a collective; an iterator dropped early (or never started) takes the rest of the broadcast when closed,
        or at the next call."""
        store = self._need(sender=False)
        if self._open_receive is not None:  # the previous broadcast left unconsumed: take its rest, in step
            for _ in self._open_receive:
                pass
        timeout = self.timeout_s if timeout_s is None else timeout_s
        n = self._seq + 1
        head = _get(store, f"w/{n}/head", timeout,
                    lambda: f"{self._where()}: rank 0 (the trainer) sent no weights within {timeout:g} s")
        _put(store, f"w/{n}/ready/{self.rank}", b"1")
        self._seq = n
        version = int(head["version"])
        self._open_receive = self._receive(n, version, into, timeout)
        return version, self._open_receive

    def _receive(self, n: int, version: int, into: Mapping[str, torch.Tensor] | None,
                 timeout: float) -> Iterator[tuple[str, torch.Tensor]]:
        buckets = self._incoming(n, version, into, timeout)
        try:
            for head, flat in buckets:
                yield from head.views(flat)
        except GeneratorExit:
            if self._store is not None:
                for _ in buckets:  # dropped early: the broadcast still has to complete on every rank
                    pass
            raise
        finally:
            self._open_receive = None

    def _incoming(self, n: int, version: int, into: Mapping[str, torch.Tensor] | None,
                  timeout: float) -> Iterator[tuple[BucketHead, torch.Tensor]]:
        """The buckets of broadcast ``n``, each received before it is yielded; the next bucket's receive is already
        posted when its manifest is there, so it arrives while this one is loaded."""
        store = self._store
        assert store is not None

        def post(k: int) -> tuple[BucketHead, torch.Tensor, Any] | None:
            head: BucketHead | None = _get(store, f"w/{n}/b/{k}", timeout, lambda: (
                f"{self._where()}: rank 0 (the trainer) sent no bucket {k} of weights version {version} "
                f"within {timeout:g} s"))
            if head is None:
                return None
            dtype = head.torch_dtype()
            if head.single:
                entry = head.entries[0]
                target = into.get(entry.name) if into is not None else None
                if (target is not None and tuple(target.shape) == entry.shape and target.dtype == dtype
                        and target.is_contiguous() and target.device == self.device):
                    flat = target.view(-1)
                else:
                    flat = torch.empty(head.numel, dtype=dtype, device=self.device)
            else:  # a buffer of its own, alive as long as a view of it is: nothing yielded is ever overwritten
                flat = torch.empty(head.numel, dtype=dtype, device=self.device)
            return head, flat, self._broadcast(flat) if head.numel else None

        k = 0
        current = post(0)
        while current is not None:
            head, flat, work = current
            if work is not None:
                self._wait(work, timeout, f"weights version {version}: rank 0 (the trainer) did not send bucket {k}")
            later = not store.check([f"w/{n}/b/{k + 1}"])
            upcoming = None if later else post(k + 1)
            yield head, flat
            current = post(k + 1) if later else upcoming
            k += 1

    # ------------------------------------------------------------------ small objects, over the store
    def send_obj(self, obj: Any) -> None:
        """Send ``obj`` (picklable: e.g. a batch of CPU tensors with its policy version) to rank 0; rollout ranks.
        Never waits for rank 0 (the store keeps it until rank 0 takes it)."""
        self._push("to0", (self.rank, obj), sender=False)

    def poll_obj(self) -> list[tuple[int, Any]]:
        """Every object the rollout ranks sent that rank 0 has not taken yet, as ``(bridge rank, obj)`` in arrival
        order (non-blocking; rank 0)."""
        store = self._need(sender=True)
        out = list(self._inbox)
        self._inbox.clear()
        while store.queue_len("to0"):
            out.append(self._pop("to0", None))
        return out

    def recv_any(self, timeout_s: float | None = None) -> tuple[int, Any]:
        """The next object from any rollout rank, ``(bridge rank, obj)``, waiting up to ``timeout_s`` (rank 0)."""
        self._need(sender=True)
        if self._inbox:
            return self._inbox.popleft()
        timeout = self.timeout_s if timeout_s is None else timeout_s
        return self._pop("to0", timeout, lambda: (f"{self._where()}: no object from "
                                                  f"{_peers(range(1, self.size))} within {timeout:g} s"))

    def notify_all(self, obj: Any) -> None:
        """Post ``obj`` (e.g. roll back to version v; stop) to every rollout rank (rank 0; never waits)."""
        self._need(sender=True)
        for r in range(1, self.size):
            self._push(f"notice/{r}", obj, sender=True)

    def poll_notice(self) -> list[Any]:
        """The notices rank 0 posted that this rollout rank has not taken yet, oldest first (non-blocking)."""
        store = self._need(sender=False)
        key = f"notice/{self.rank}"
        out = []
        while store.queue_len(key):
            out.append(self._pop(key, None))
        return out

    def wait_notice(self, timeout_s: float) -> Any:
        """The next notice from rank 0, waiting up to ``timeout_s`` (rollout ranks)."""
        self._need(sender=False)
        return self._pop(f"notice/{self.rank}", timeout_s, lambda: (
            f"{self._where()}: rank 0 (the trainer) posted no notice within {timeout_s:g} s"))

    # ------------------------------------------------------------------ internals
    def _where(self) -> str:
        return f"bridge {self.addr}:{self.port} rank {self.rank}/{self.size}"

    def _need(self, *, sender: bool) -> dist.TCPStore:
        if self._store is None:
            raise BridgeError(f"{self._where()}: the bridge is closed")
        if sender != (self.rank == 0):
            raise BridgeError(f"{self._where()}: only {'rank 0' if sender else 'rollout ranks'} may do this")
        return self._store

    def _broadcast(self, flat: torch.Tensor) -> Any:
        options = BroadcastOptions()
        options.rootRank = 0
        return self._group.broadcast([as_bytes(flat)], options)

    def _wait(self, work: Any, timeout: float, what: str) -> None:
        try:
            work.wait(datetime.timedelta(seconds=timeout))
        except RuntimeError as exc:
            raise BridgeTimeout(f"{self._where()}: {what} within {timeout:g} s ({_first_line(exc)})") from None

    def _take_buffer(self, dtype: torch.dtype, numel: int, timeout: float) -> torch.Tensor:
        """The sender's next bucket buffer of this dtype (two per dtype, kept from one broadcast to the next), after
        the collective last run on it is done; grown to ``numel`` elements if a bucket needs more."""
        pool = self._pools.setdefault(dtype, [])
        turn = self._turn[dtype] = (self._turn.get(dtype, 1) + 1) % 2
        if len(pool) <= turn:
            pool.append((torch.empty(0, dtype=dtype, device=self.device), None))
        buffer, work = pool[turn]
        if work is not None:
            self._wait(work, timeout, "a previous bucket did not complete")
        want = max(numel, capacity(self.bucket_bytes, dtype))
        if buffer.numel() < want:
            buffer = torch.empty(want, dtype=dtype, device=self.device)
        pool[turn] = (buffer, None)
        return buffer

    def _forget(self, n: int) -> None:
        """Delete broadcast ``n``'s keys: every receiver has read them (each said it is ready for ``n + 1``)."""
        if n < 1 or self._store is None:
            return
        keys = [f"w/{n}/head", *(f"w/{n}/ready/{r}" for r in range(1, self.size)),
                *(f"w/{n}/b/{k}" for k in range(self._last_buckets))]
        for key in keys:
            self._store.delete_key(key)

    def _push(self, queue: str, obj: Any, *, sender: bool) -> None:
        store = self._need(sender=sender)
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) <= PIECE_BYTES:
            store.queue_push(queue, pickle.dumps((0, data)))
            return
        m = f"piece/{self.rank}/{next(self._messages)}"
        pieces = [data[i:i + PIECE_BYTES] for i in range(0, len(data), PIECE_BYTES)]
        for i, piece in enumerate(pieces):
            _put(store, f"{m}/{i}", piece)
        store.queue_push(queue, pickle.dumps((len(pieces), m)))  # announced once whole

    def _pop(self, queue: str, timeout: float | None, what: Any = None) -> Any:
        store = self._store
        assert store is not None
        if timeout is None:
            raw = store.queue_pop(queue, False)
        else:
            store.set_timeout(datetime.timedelta(seconds=timeout))
            try:
                raw = store.queue_pop(queue, True)
            except RuntimeError as exc:  # a timeout, or rank 0's store gone
                gone = "" if "timeout" in str(exc) else f" (the store is gone: {_first_line(exc)})"
                raise BridgeTimeout(what() + gone) from None
            finally:
                store.set_timeout(datetime.timedelta(seconds=self.timeout_s))
        count, payload = pickle.loads(raw)
        if count:
            keys = [f"{payload}/{i}" for i in range(count)]
            payload = b"".join(store.multi_get(keys))
            for key in keys:
                store.delete_key(key)
        return pickle.loads(payload)


def _set(store: dist.Store, key: str, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > PIECE_BYTES:
        raise BridgeError(f"bridge store value {key!r} is {len(data)} bytes, over {PIECE_BYTES}: use smaller buckets")
    _put(store, key, data)


def _put(store: dist.Store, key: str, data: bytes) -> None:
    """``store.set`` of bytes: the binding takes any ``std::string`` (bytes included), the stub says ``str``."""
    store.set(key, data)  # type: ignore[arg-type]


def _get(store: dist.Store, key: str, timeout: float | None = None, what: Any = None) -> Any:
    if timeout is not None:
        _wait_keys(store, [key], timeout, lambda _missing: what())
    return pickle.loads(store.get(key))


def _join(store: dist.TCPStore, rank: int, size: int, timeout_s: float) -> list[int]:
    """Meet the other members on the store; the ranks that did not come (empty: all did). Rank 0 alone waits for
    every member and posts the verdict, which the others wait for: every member that came reports the same missing
    ranks, and rank 0 keeps the store up until they have read it (at most ``JOIN_ACK_S``)."""
    _put(store, f"join/{rank}", b"1")
    if rank == 0:
        keys = [f"join/{r}" for r in range(1, size)]
        try:
            store.wait(keys, datetime.timedelta(seconds=timeout_s))
            missing: list[int] = []
        except RuntimeError:
            missing = [r for r in range(1, size) if not store.check([f"join/{r}"])]
        _set(store, "verdict", missing)
        if missing:
            try:
                store.wait([f"seen/{r}" for r in range(1, size) if r not in missing],
                           datetime.timedelta(seconds=JOIN_ACK_S))
            except RuntimeError:
                pass
        return missing
    where = f"bridge rank {rank}/{size}"
    # rank 0's verdict comes at most timeout_s after it started its store, which was before this rank reached it
    _wait_keys(store, ["verdict"], timeout_s + JOIN_ACK_S,
               lambda _: f"{where}: rank 0 (the trainer) gave no verdict on who joined within {timeout_s:g} s")
    missing = _get(store, "verdict")
    if missing:
        _put(store, f"seen/{rank}", b"1")
    return missing


def _wait_keys(store: dist.Store, keys: list[str], timeout: float, what: Any) -> None:
    """Wait until every key exists; after ``timeout`` s raise :class:`BridgeTimeout` with ``what(missing ranks)``
    (a key's last component is the rank it stands for); a store that went away (rank 0 left) names rank 0."""
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout))
    except RuntimeError as exc:  # DistStoreError "wait timeout after ...", DistNetworkError when the server is gone
        try:
            missing = [int(k.rsplit("/", 1)[1]) if k.rsplit("/", 1)[1].isdigit() else 0
                       for k in keys if not store.check([k])]
        except RuntimeError:
            raise BridgeTimeout(f"{what([0])} (rank 0 (the trainer) left: its store is gone: "
                                f"{_first_line(exc)})") from None
        raise BridgeTimeout(what(missing)) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
