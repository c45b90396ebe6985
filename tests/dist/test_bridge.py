"""The split placement's bridge on real gloo processes (issue 35, point 3): trainer rank 0 broadcasts weights to the
rollout ranks on a store and group of its own; objects and notices go over the store; every wait is bounded.

- three processes, one sender and two receivers: weights of several dtypes and odd sizes arrive bit for bit (NaN,
  -0.0, bool, a tensor larger than a bucket, an empty one), with their versions, over two broadcasts; the large one
  straight into the receiver's own tensor (``into``); objects both ways, a large one in pieces; notices; and close()
  leaves no thread and frees rank 0's port;
- the trainer's world: two FSDP2 ranks whose default group holds only them, ``iter_full_params`` on both feeding the
  bridge on rank 0, a rollout process with no default group at all loading the weights (bit for bit);
- a missing peer: every wait ends in one line naming it.
"""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch
from _spawn import free_port, run_distributed

TIMEOUT_S = 60.0
BUCKET = 1024  # bytes: several buckets per dtype, and the fp16 tensor below is larger than one


def _weights(version: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(version)
    odd = torch.randn(7, 13, generator=g)
    odd[0, :3] = torch.tensor([float("nan"), -0.0, float("inf")])
    return [
        ("a.odd", odd),
        ("a.bf16", torch.randn(300, generator=g).to(torch.bfloat16)),
        ("a.ids", torch.randint(-2**40, 2**40, (5,), generator=g)),
        ("a.mask", torch.rand(17, generator=g) > 0.5),
        ("big.fp16", torch.randn(40, 50, generator=g).to(torch.float16)),  # 4000 bytes > BUCKET: sent alone
        ("empty", torch.empty(0, 4)),
        ("scalar", torch.tensor(float(version), dtype=torch.float64)),
        *((f"many.{i}", torch.randn(i + 1, generator=g)) for i in range(40)),  # fills several fp32 buckets
    ]


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def _three(rank: int, world: int, port: int) -> dict:
    from hpcppo.distributed.bridge import Bridge

    torch.ones(4).add_(1)  # any lazily started pool of torch's exists before the baseline
    before = _tasks()
    bridge = Bridge.connect("127.0.0.1", port, rank, world, timeout_s=TIMEOUT_S, bucket_bytes=BUCKET)
    out: dict = {"during": _tasks()}
    if rank == 0:
        out["t0"] = time.time()
        out["stats"] = [bridge.broadcast_weights(iter(_weights(1)), version=3)]
        out["recv_any"] = sorted([bridge.recv_any(timeout_s=TIMEOUT_S), bridge.recv_any(timeout_s=TIMEOUT_S)])
        bridge.notify_all(("rollback", 2))
        bridge.notify_all(("stop",))
        out["stats"].append(bridge.broadcast_weights(iter(_weights(2)), version=7))
        # each rollout rank sent its objects before it took version 7: all are here now
        out["polled"] = bridge.poll_obj()
        out["polled_again"] = bridge.poll_obj()
    else:
        if rank == 2:  # a rollout rank still busy: the broadcast waits for it before any byte moves
            time.sleep(0.5)
        out["ready_at"] = time.time()
        version, it = bridge.receive_weights(timeout_s=TIMEOUT_S)
        held = list(it)  # all held before any is read, as vLLM's engine groups them: none may be overwritten
        out["first"] = (version, [(n, t.dtype, tuple(t.shape), _bits(t)) for n, t in held])
        del held
        out["notices_early"] = bridge.poll_notice()  # rank 0 posts only once both hellos are in
        bridge.send_obj(("hello", rank))
        out["first_notice"] = bridge.wait_notice(TIMEOUT_S)  # posted once both hellos are in
        bridge.send_obj({"rank": rank, "rows": torch.arange(6).view(2, 3) * rank, "version": version})
        if rank == 1:
            bridge.send_obj(b"\x07" * (9 << 20))  # over the store's 8 MiB payload limit: goes in pieces
        mine = torch.empty(40, 50, dtype=torch.float16)
        version, it = bridge.receive_weights(timeout_s=TIMEOUT_S, into={"big.fp16": mine})
        got = []
        for n, t in it:
            got.append((n, t.dtype, tuple(t.shape), _bits(t)))
            if n == "big.fp16":
                out["into_used"] = t.data_ptr() == mine.data_ptr()
        out["second"] = (version, got)
        out["notices"] = bridge.poll_notice()
        out["pending_after"] = bridge.pending_weights()
    bridge.close()
    out["after"] = _tasks()
    out["before"] = before
    if rank == 0:  # the store's server is gone: its port can be listened on again
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
            out["port_free"] = True
    return out


@pytest.fixture(scope="module")
def three() -> list[dict]:
    return run_distributed(_three, 3, free_port())


def _expected(version: int) -> dict[str, tuple]:
    return {n: (t.dtype, tuple(t.shape), _bits(t)) for n, t in _weights(version)}


def test_weights_arrive_bit_exact_with_their_versions(three):
    for out in three[1:]:
        for key, seed, version in (("first", 1, 3), ("second", 2, 7)):
            got_version, got = out[key]
            assert got_version == version
            assert sorted(n for n, *_ in got) == sorted(_expected(seed)), "every tensor exactly once"
            assert {n: tuple(rest) for n, *rest in got} == _expected(seed)
        assert out["into_used"], "a tensor larger than a bucket goes straight into the receiver's own tensor"
        assert out["pending_after"] is None
    first, second = three[0]["stats"]
    assert (first.version, second.version) == (3, 7) and first.tensors == len(_weights(1))
    assert first.bytes == sum(t.numel() * t.element_size() for _, t in _weights(1))
    assert first.buckets > 3  # several per dtype at 1 KB
    # the wait for the late receiver is counted apart, and the rate is the transfer's alone
    assert three[0]["t0"] + first.waited >= three[2]["ready_at"] - 0.01 and 0 < first.waited < first.seconds
    assert first.gbps == pytest.approx(first.bytes / (first.seconds - first.waited) / 1e9)


def test_objects_go_both_ways_and_notices_arrive_in_order(three):
    assert three[0]["recv_any"] == [(1, ("hello", 1)), (2, ("hello", 2))]
    polled = three[0]["polled"]
    rows = {src: obj for src, obj in polled if isinstance(obj, dict)}
    assert sorted(rows) == [1, 2] and all(rows[r]["version"] == 3 for r in rows)
    assert torch.equal(rows[2]["rows"], torch.arange(6).view(2, 3) * 2)
    assert [obj for src, obj in polled if src == 1 and isinstance(obj, bytes)] == [b"\x07" * (9 << 20)]
    assert len(polled) == 3 and three[0]["polled_again"] == []
    for out in three[1:]:
        assert out["notices_early"] == []
        assert out["first_notice"] == ("rollback", 2)
        assert out["notices"] == [("stop",)]  # posted before version 7, taken after it: in order, each once


def test_close_leaves_no_thread_and_frees_the_port(three):
    for out in three:
        assert out["during"] > out["before"]  # the group's and the store's threads ran
        assert out["after"] == out["before"], out
    assert three[0]["port_free"]


# ----------------------------------------------------------------------------- the trainer's world beside it
def _trainers_and_rollout(rank: int, world: int, init_file: str, port: int) -> dict:
    import datetime

    import torch.distributed as dist
    from _models import batch, lm_loss, tiny_lm
    from torch.distributed.device_mesh import init_device_mesh

    from hpcppo.distributed.bridge import Bridge
    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.weights import iter_full_params, load_into

    dist.destroy_process_group()  # the trainer's world is processes 0 and 1; process 2 is a rollout rank outside it
    if rank < 2:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))
    out: dict = {"default_world": dist.get_world_size() if dist.is_initialized() else None}
    if rank == 1:  # a trainer rank outside the bridge: it takes part in the gathers only
        model = apply_fsdp(tiny_lm(0), init_device_mesh("cpu", (2,)), param_dtype=None, reduce_dtype=None,
                           cpu_offload=False, reshard_after_forward=True)
        lm_loss(model, batch(rank)).backward()
        torch.optim.SGD(model.parameters(), lr=0.5).step()
        for _ in iter_full_params(model, bucket_bytes=BUCKET):
            pass
        out["sum"] = dist.all_reduce(torch.ones(1)) or None
        dist.destroy_process_group()
        return out
    bridge = Bridge.connect("127.0.0.1", port, 0 if rank == 0 else 1, 2, timeout_s=TIMEOUT_S, bucket_bytes=4096)
    if rank == 0:
        model = apply_fsdp(tiny_lm(0), init_device_mesh("cpu", (2,)), param_dtype=None, reduce_dtype=None,
                           cpu_offload=False, reshard_after_forward=True)
        lm_loss(model, batch(rank)).backward()
        torch.optim.SGD(model.parameters(), lr=0.5).step()
        sent: dict[str, bytes] = {}

        def tee():
            for n, t in iter_full_params(model, bucket_bytes=BUCKET):
                sent[n] = _bits(t)
                yield n, t

        bridge.broadcast_weights(tee(), version=1)
        t = torch.ones(1)
        dist.all_reduce(t)  # the default group still works after and beside the bridge
        out["sum"], out["sent"] = t.item(), sent
        dist.destroy_process_group()
    else:
        engine = tiny_lm(5)
        version, it = bridge.receive_weights(timeout_s=TIMEOUT_S)
        load_into(engine, it)
        out["version"] = version
        out["loaded"] = {n: _bits(p) for n, p in engine.named_parameters()}
    bridge.close()
    return out


def test_fsdp_trainers_sync_a_rollout_rank_outside_their_world(tmp_path):
    outs = run_distributed(_trainers_and_rollout, 3, str(tmp_path / "trainers"), free_port())
    assert [o["default_world"] for o in outs] == [2, 2, None]
    assert outs[0]["sum"] == 2.0
    assert outs[2]["version"] == 1
    sent, loaded = outs[0]["sent"], outs[2]["loaded"]
    assert sorted(sent) == sorted(loaded) and all(sent[n] == loaded[n] for n in sent)
    untouched = {n: _bits(p) for n, p in __import__("_models").tiny_lm(0).named_parameters()}
    assert any(untouched[n] != sent[n] for n in sent), "the trained weights went, not the initial ones"


# ----------------------------------------------------------------------------- missing peers
def _missing(rank: int, world: int, ports: list[int]) -> dict:
    import torch.distributed as dist

    from hpcppo.distributed.bridge import Bridge, BridgeTimeout

    out: dict = {}
    try:
        Bridge.connect("127.0.0.1", ports[0], rank, 3, timeout_s=2)  # rank 2 never comes
    except BridgeTimeout as exc:
        out["join"] = str(exc)
    bridge = Bridge.connect("127.0.0.1", ports[1], rank, 2, timeout_s=TIMEOUT_S)
    if rank == 0:
        try:
            bridge.recv_any(timeout_s=1)
        except BridgeTimeout as exc:
            out["recv_any"] = str(exc)
        dist.barrier()  # the rollout rank's receive has timed out: it takes no weights now
        try:
            bridge.broadcast_weights(iter(_weights(1)), version=5, timeout_s=1)
        except BridgeTimeout as exc:
            out["broadcast"] = str(exc)
        dist.barrier()
    else:
        for name, call in (("receive", lambda: bridge.receive_weights(timeout_s=1)),
                           ("notice", lambda: bridge.wait_notice(1))):
            try:
                call()
            except BridgeTimeout as exc:
                out[name] = str(exc)
        dist.barrier()
        dist.barrier()
    bridge.close(wait_s=5)
    # a rollout rank that said it is ready but never takes the bytes: the collective's wait ends, naming it
    bridge = Bridge.connect("127.0.0.1", ports[2], rank, 2, timeout_s=TIMEOUT_S)
    if rank == 0:
        start = time.monotonic()
        try:
            bridge.broadcast_weights([("huge", torch.zeros(64 << 20, dtype=torch.uint8))], version=9, timeout_s=2)
        except BridgeTimeout as exc:
            out["stalled"] = str(exc)
        out["stalled_s"] = time.monotonic() - start
        dist.barrier()
    else:
        version, _it = bridge.receive_weights(timeout_s=TIMEOUT_S)  # ready, and then never iterated
        dist.barrier()
    bridge.close(wait_s=5)
    return out


def test_every_wait_ends_in_one_line_naming_the_missing_peer():
    ports = [free_port(), free_port(), free_port()]
    sender, receiver = run_distributed(_missing, 2, ports)
    assert "rollout rank 2 did not join within 2 s" in sender["join"]
    assert "rollout rank 2 did not join within 2 s" in receiver["join"]
    assert "no object from rollout rank 1 within 1 s" in sender["recv_any"]
    assert "rollout rank 1 did not take weights version 5 within 1 s" in sender["broadcast"]
    assert "rank 0 (the trainer) sent no weights within 1 s" in receiver["receive"]
    assert "rank 0 (the trainer) posted no notice within 1 s" in receiver["notice"]
    assert "rollout rank 1 did not all receive bucket 0 of weights version 9 within 2 s" in sender["stalled"]
    assert sender["stalled_s"] < TIMEOUT_S / 2  # the call's own timeout, not the group's (TIMEOUT_S)
    for line in [v for v in (*sender.values(), *receiver.values()) if isinstance(v, str)]:
        assert "\n" not in line and line.startswith("bridge 127.0.0.1:"), line
