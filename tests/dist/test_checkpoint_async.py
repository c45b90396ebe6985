"""Background checkpoints (``CheckpointManager.save(..., background=True)``, ``checkpoint.async_save``).

What must hold: the caller waits only for the staging (the state written is the state at the call, whatever the
training does next), the write overlaps what follows, ``COMMITTED`` appears only once every rank's bytes are durable,
failures surface on every rank at the next wait, and a process killed during the background write leaves the
previous checkpoint as the newest committed one (a real subprocess, killed with SIGKILL).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from _models import batch, disk_full_on_rank, lm_loss
from _spawn import run_distributed
from test_checkpoint import _build, _models, _snapshot, _train_step

from hpcppo.distributed.checkpoint import CheckpointManager
from hpcppo.rundir import checkpoints as layout

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- single process
def _tiny(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(64, 32)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    return model, opt


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(2, 64)).pow(2).sum().backward()
    opt.step()
    opt.zero_grad()


def test_background_save_writes_the_state_of_the_call_not_the_state_at_write_time(tmp_path, monkeypatch):
    import hpcppo.distributed.checkpoint as ckpt

    mgr = CheckpointManager(tmp_path, keep_last=0)
    model, opt = _tiny()
    # The small files are written after DCP's shards, in the save's thread: hold them until the step below is done,
    # so the training step certainly runs while the write is in flight.
    real_write, release = ckpt.write_durable, __import__("threading").Event()

    def held_write(path, data):
        assert release.wait(30), "the test never released the write"
        real_write(path, data)

    monkeypatch.setattr(ckpt, "write_durable", held_write)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    moment = opt.state[model.weight]["exp_avg"].clone()
    rng_at_call = torch.get_rng_state()
    out = mgr.save(1, models={"m": model}, optimizers={"m": opt}, extra={"step": 1}, background=True)
    assert mgr.pending_step == 1 and not layout.is_committed(out)  # returned before the commit
    _step(model, opt)  # the next training step updates the weights and the moments in place
    torch.rand(5)
    assert not torch.equal(model.weight, weights["weight"])
    release.set()
    assert mgr.latest_committed() == 1 and mgr.pending_step is None  # the query waited for the commit
    assert mgr.last_blocking_s is not None and mgr.last_save_s is not None
    assert mgr.last_blocking_s < mgr.last_save_s

    model2, opt2 = _tiny(7)
    mgr.load(1, models={"m": model2}, optimizers={"m": opt2}, restore_rng=True, verify_shards=True)
    for k, v in model2.state_dict().items():
        assert torch.equal(v, weights[k]), k
    assert torch.equal(opt2.state[model2.weight]["exp_avg"], moment)
    assert torch.equal(torch.get_rng_state(), rng_at_call)  # the RNG of the call, not of the write


def test_a_failed_background_save_raises_at_the_next_wait_once_and_commits_nothing(tmp_path, monkeypatch):
    import hpcppo.distributed.checkpoint as ckpt

    mgr = CheckpointManager(tmp_path, keep_last=0)
    model, opt = _tiny()
    mgr.save(1, models={"m": model}, optimizers={"m": opt}, extra={"step": 1}, background=True)
    mgr.wait()

    def full_disk(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "write_durable", full_disk)
    mgr.save(2, models={"m": model}, optimizers={"m": opt}, extra={"step": 2}, background=True)
    assert mgr.latest_committed() == 1  # a query settles the failed save without raising it ...
    with pytest.raises(OSError, match="No space left"):  # ... the next save (or wait) raises it, naming its step
        mgr.save(9, models={"m": model}, optimizers={"m": opt}, extra={"step": 9})
    assert mgr.failed_step == 2
    mgr.wait()  # raised once
    assert mgr.failed_step is None
    monkeypatch.undo()
    assert mgr.list_committed() == [1]
    # the next save works and retention clears the debris of the failed one
    mgr.save(3, models={"m": model}, optimizers={"m": opt}, extra={"step": 3}, background=True)
    assert mgr.list_committed() == [1, 3]
    assert not layout.stale_dirs(tmp_path)


def test_a_synchronous_save_and_load_wait_for_the_background_one(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    model, opt = _tiny()
    for step in (1, 2, 3):
        mgr.save(step, models={"m": model}, optimizers={"m": opt}, extra={"step": step}, background=step < 3)
        _step(model, opt)
    assert mgr.pending_step is None and mgr.list_committed() == [2, 3]
    model2, opt2 = _tiny(7)
    mgr.save(4, models={"m": model}, optimizers={"m": opt}, extra={"step": 4}, background=True)
    assert mgr.load(4, models={"m": model2}, optimizers={"m": opt2})["step"] == 4  # load waited


# ---------------------------------------------------------------- two gloo ranks, FSDP
def _two_rank_worker(rank: int, world: int, root: str) -> dict:
    from hpcppo.distributed.env import all_reduce_host

    actor, critic, ref, actor_opt, critic_opt, sched = _build(world, seed=0)
    models, opts = _models(actor, critic, ref, actor_opt, critic_opt)
    mgr = CheckpointManager(root, keep_last=0, timeout_s=60)
    out: dict = {"snapshots": {}, "blocking_s": [], "save_s": []}
    for step in (1, 2, 3):
        _train_step(actor, critic, actor_opt, critic_opt, sched, batch(step).chunk(world)[rank])
        out["snapshots"][step] = _snapshot(actor, actor_opt)
        mgr.save(step, models=models, optimizers=opts, extra={"step": step}, background=True)
        out["blocking_s"].append(mgr.last_blocking_s)
        # training collectives on the default group while the save's thread runs its own on the checkpoint group
        for _ in range(20):
            all_reduce_host([float(rank)], "sum")
    out["committed"] = mgr.list_committed()
    out["save_s"] = mgr.last_save_s

    for step in (1, 3):
        actor2, critic2, ref2, actor_opt2, critic_opt2, _ = _build(world, seed=10)
        models2, opts2 = _models(actor2, critic2, ref2, actor_opt2, critic_opt2)
        mgr.load(step, models=models2, optimizers=opts2, verify_shards=True)
        out[f"loaded_{step}"] = _snapshot(actor2, actor_opt2)

    # A write that fails on rank 1 only fails the background save on both ranks, at the next wait.
    with disk_full_on_rank(1, rank):
        mgr.save(4, models=models, optimizers=opts, extra={"step": 4}, background=True)
        out["returned_before_failure"] = True
        try:
            mgr.wait()
            out["failed"] = None
        except Exception as exc:
            out["failed"] = f"{type(exc).__name__}: {exc}"
    out["latest_after_failure"] = mgr.latest_committed()
    out["loss_after"] = lm_loss(actor, batch(9).chunk(world)[rank]).item()  # the default group still works
    return out


def test_two_ranks_background_saves_are_exact_and_fail_together(tmp_path):
    results = run_distributed(_two_rank_worker, 2, str(tmp_path))
    for rank, r in enumerate(results):
        assert r["committed"] == [1, 2, 3], rank
        for step in (1, 3):
            saved, loaded = r["snapshots"][step], r[f"loaded_{step}"]
            for part in ("params", "moments"):
                assert saved[part].keys() == loaded[part].keys()
                for key in saved[part]:
                    assert torch.equal(saved[part][key], loaded[part][key]), (rank, step, key)
        assert r["returned_before_failure"]
        assert r["failed"] and "No space left" in r["failed"], (rank, r["failed"])  # rank 0 names rank 1's error
        assert r["latest_after_failure"] == 3
        assert r["loss_after"] == pytest.approx(r["loss_after"])  # not NaN: FSDP's all-gathers still ran
    assert "rank(s) 1" in results[0]["failed"]
    assert not layout.is_committed(layout.step_dir(tmp_path, 4))


# ---------------------------------------------------------------- a kill during the background write
_KILL_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import torch
    import hpcppo.distributed.checkpoint as ckpt
    from torch.distributed.checkpoint import FileSystemWriter

    root, where = Path(sys.argv[1]), sys.argv[2]
    flag = root.parent / "in-write"

    def slow(fn):
        def wrapped(*args, **kwargs):
            flag.write_text("writing")
            time.sleep(120)  # the parent kills us long before
            return fn(*args, **kwargs)
        return wrapped

    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 256)).sum().backward()
    opt.step()
    mgr = ckpt.CheckpointManager(root, keep_last=2)
    mgr.save(1, models={"m": model}, optimizers={"m": opt}, extra={"step": 1}, background=True)
    mgr.wait()
    if where == "dcp":  # inside DCP's own write of the shards
        FileSystemWriter.write_data = slow(FileSystemWriter.write_data)
    else:  # after the shards, while this rank's small files are written (before the commit)
        ckpt.write_durable = slow(ckpt.write_durable)
    t0 = time.perf_counter()
    mgr.save(2, models={"m": model}, optimizers={"m": opt}, extra={"step": 2}, background=True)
    print(json.dumps({"returned_after_s": time.perf_counter() - t0}), flush=True)
    while True:  # the training goes on while the write is in flight
        model(torch.randn(4, 256)).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.01)
""")


@pytest.mark.parametrize("where", ["dcp", "small_files"])
def test_a_kill_during_the_background_write_leaves_the_previous_checkpoint_newest(tmp_path, where):
    root = tmp_path / "checkpoints"
    script = tmp_path / "kill_during_write.py"
    script.write_text(_KILL_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(root), where], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()  # save() returned while the write is held
        assert line, proc.stderr.read()
        deadline = time.monotonic() + 60
        while not (tmp_path / "in-write").exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert json.loads(line)["returned_after_s"] < 30  # it returned long before the held write could finish

    mgr = CheckpointManager(root, keep_last=2, rank=0, world_size=1)
    assert mgr.latest_committed() == 1
    debris = layout.stale_dirs(root)
    assert [p.name.split(".tmp-")[0] for p in debris] == ["step-2"]
    assert not (debris[0] / layout.MARKER).exists()
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 256)).sum().backward()
    opt.step()
    assert mgr.load(1, models={"m": model}, optimizers={"m": opt}, verify_shards=True)["step"] == 1
    assert mgr.prune() == debris and not debris[0].exists()  # retention removes the debris


def _timeout_worker(rank: int, world: int, root: str) -> list[float]:
    # _spawn gives the default group a 60 s timeout; the checkpoint group follows it unless told otherwise
    return [CheckpointManager(root, keep_last=0)._timeout().total_seconds(),
            CheckpointManager(root, keep_last=0, timeout_s=7)._timeout().total_seconds()]


def test_the_background_group_takes_the_jobs_collective_timeout(tmp_path):
    assert run_distributed(_timeout_worker, 1, str(tmp_path)) == [[60.0, 7.0]]
