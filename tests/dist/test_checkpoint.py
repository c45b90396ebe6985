"""CheckpointManager: DCP round trips on real gloo ranks (2 -> 2, 2 -> 1), atomicity, crash debris, retention,
and damage: the manifest the commit records, verification, and the fallback every rank agrees on."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from _models import Critic, batch, disk_full_on_rank, lm_loss, tiny_lm
from _spawn import run_distributed

from hpcppo.distributed.checkpoint import CheckpointManager, CorruptCheckpointError, NoIntactCheckpointError
from hpcppo.errors import RunStateError
from hpcppo.rundir import checkpoints as layout


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    # full_tensor() on a 1-rank mesh returns the local shard itself: clone so later updates don't show through.
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def _snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    """Full params and Adam state by parameter name (collective for FSDP models)."""
    names = {id(p): n for n, p in model.named_parameters()}
    moments = {}
    for p, st in opt.state.items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            moments[f"{names[id(p)]}:{key}"] = _full(st[key])
    return {"params": {n: _full(p) for n, p in model.named_parameters()}, "moments": moments}


def _build(world: int, seed: int, sharded: bool = True):
    """Actor (+AdamW, +LR schedule), critic (+AdamW), frozen reference; FSDP-sharded when ``sharded``."""
    from hpcppo.distributed.fsdp import apply_fsdp
    from hpcppo.distributed.mesh import build_mesh

    actor, critic, ref = tiny_lm(seed), Critic(seed + 1), tiny_lm(seed + 2)
    if sharded:
        mesh = build_mesh("cpu", world, 1, hsdp=False)
        for m in (actor, critic, ref):
            apply_fsdp(m, mesh, param_dtype=None, reduce_dtype=None, cpu_offload=False, reshard_after_forward=True)
    actor_opt = torch.optim.AdamW(actor.parameters(), lr=1e-2)
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LinearLR(actor_opt, start_factor=0.5, total_iters=10)
    return actor, critic, ref, actor_opt, critic_opt, sched


def _train_step(actor, critic, actor_opt, critic_opt, sched, ids: torch.Tensor) -> float:
    loss = lm_loss(actor, ids)
    loss.backward()
    actor_opt.step()
    actor_opt.zero_grad()
    sched.step()
    (critic(ids) ** 2).mean().backward()
    critic_opt.step()
    critic_opt.zero_grad()
    return loss.item()


def _continuation(actor, actor_opt, ids3: torch.Tensor, ids4: torch.Tensor) -> tuple[float, float]:
    """Loss of one more update (depends on the Adam moments) and the loss right after it."""
    loss_a = lm_loss(actor, ids3)
    loss_a.backward()
    actor_opt.step()
    actor_opt.zero_grad()
    with torch.no_grad():
        loss_b = lm_loss(actor, ids4)
    return loss_a.item(), loss_b.item()


def _models(actor, critic, ref, actor_opt, critic_opt):
    return {"actor": actor, "critic": critic, "ref": ref}, {"actor": actor_opt, "critic": critic_opt}


def _save_worker(rank: int, world: int, root: str) -> dict:
    actor, critic, ref, actor_opt, critic_opt, sched = _build(world, seed=0)
    models, opts = _models(actor, critic, ref, actor_opt, critic_opt)
    mgr = CheckpointManager(root, keep_last=2)
    out: dict = {"save_s": []}
    for step in (1, 2):
        _train_step(actor, critic, actor_opt, critic_opt, sched, batch(step).chunk(world)[rank])
        if step == 2:
            torch.manual_seed(100 + rank)  # distinct per-rank RNG streams, saved per rank
        extra = {"step": step, "cursor": {"epoch": 0, "index": 4 * step}, "sched": sched.state_dict(),
                 "kl": {"kl_coef": 0.1 * step}, "watchdog": {"counts": {"kl_raise": step}}}
        mgr.save(step, models=models, optimizers=opts, extra=extra)
        out["save_s"].append(mgr.last_save_s)
    out["saved"] = _snapshot(actor, actor_opt)
    out["saved_critic"] = _snapshot(critic, critic_opt)
    out["saved_extra"] = extra
    out["rng_after_save"] = torch.rand(3)
    ids3, ids4 = batch(3).chunk(world)[rank], batch(4).chunk(world)[rank]
    out["continuation"] = _continuation(actor, actor_opt, ids3, ids4)

    # Resume on the same world size into differently initialised models.
    actor2, critic2, ref2, actor_opt2, critic_opt2, sched2 = _build(world, seed=10)
    models2, opts2 = _models(actor2, critic2, ref2, actor_opt2, critic_opt2)
    extra2 = mgr.load(2, models=models2, optimizers=opts2)
    out["load_s"] = mgr.last_load_s
    out["load_direct"] = mgr.last_load_direct
    out["rng_after_load"] = torch.rand(3)
    sched2.load_state_dict(extra2["sched"])
    out["loaded_extra"] = extra2
    out["loaded"] = _snapshot(actor2, actor_opt2)
    out["loaded_critic"] = _snapshot(critic2, critic_opt2)
    out["ref_equal"] = all(torch.equal(_full(a), _full(b)) for a, b in zip(ref.parameters(), ref2.parameters()))
    out["lr_after_load"] = (actor_opt.param_groups[0]["lr"], actor_opt2.param_groups[0]["lr"])
    out["continuation_loaded"] = _continuation(actor2, actor_opt2, ids3, ids4)
    out["committed_before_step3"] = mgr.list_committed()
    mgr.save(3, models=models, optimizers=opts, extra={"step": 3})
    out["committed_after_step3"] = mgr.list_committed()

    # A write that fails on one rank only must fail the save on every rank, promptly, and commit nothing.
    t0 = time.perf_counter()
    with disk_full_on_rank(1, rank):
        try:
            mgr.save(4, models=models, optimizers=opts, extra={"step": 4})
            out["failed_save"] = None
        except Exception as exc:
            out["failed_save"] = (type(exc).__name__, str(exc), time.perf_counter() - t0)
    out["latest_after_failed_save"] = mgr.latest_committed()
    return out


def _load_one_rank_worker(rank: int, world: int, root: str) -> dict:
    out = {}
    for sharded in (True, False):  # FSDP on a 1-rank mesh, and a plain model (what an HF export would use)
        actor, critic, ref, actor_opt, critic_opt, _ = _build(world, seed=20, sharded=sharded)
        models, opts = _models(actor, critic, ref, actor_opt, critic_opt)
        mgr = CheckpointManager(root, keep_last=2)
        extra = mgr.load(2, models=models, optimizers=opts)
        out[sharded] = {"snapshot": _snapshot(actor, actor_opt), "extra": extra, "load_s": mgr.last_load_s,
                        "load_direct": mgr.last_load_direct,
                        "continuation": _continuation(actor, actor_opt, batch(3), batch(4))}
    return out


def _assert_identical(a: dict, b: dict) -> None:
    for part in ("params", "moments"):
        assert a[part].keys() == b[part].keys()
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), key


@pytest.fixture(scope="module")
def saved_two_ranks(tmp_path_factory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("ckpt") / "checkpoints"
    return root, run_distributed(_save_worker, 2, str(root))


def test_two_rank_save_then_two_rank_load_is_bit_identical(saved_two_ranks):
    _, results = saved_two_ranks
    for r in results:
        _assert_identical(r["saved"], r["loaded"])
        _assert_identical(r["saved_critic"], r["loaded_critic"])
        assert r["saved"]["moments"]  # Adam state really exists and was compared
        assert r["ref_equal"]
        assert r["continuation_loaded"] == r["continuation"]
        assert r["loaded_extra"] == r["saved_extra"]
        # Same world size: every tensor was read straight into the model's and optimizer's own tensors.
        assert r["load_direct"][0] == r["load_direct"][1] > 20
        assert r["lr_after_load"][0] == r["lr_after_load"][1]
        # Each rank's own RNG stream resumes where it was saved.
        assert torch.equal(r["rng_after_load"], r["rng_after_save"])
    assert not torch.equal(results[0]["rng_after_save"], results[1]["rng_after_save"])


def test_retention_keeps_last_two(saved_two_ranks):
    root, results = saved_two_ranks
    assert results[0]["committed_before_step3"] == [1, 2]
    assert results[0]["committed_after_step3"] == [2, 3]
    names = sorted(p.name for p in root.iterdir())
    # step-2, step-3, and the tmp directory of the failed step-4 save (the next prune removes it)
    assert names[:2] == ["step-2", "step-3"] and len(names) == 3 and names[2].startswith("step-4.tmp-")
    files = sorted(p.name for p in (root / "step-2").iterdir())
    assert files == ["COMMITTED", "dcp", "extra.pt", "rng-rank0.pt", "rng-rank1.pt"]
    assert layout.read_marker(root / "step-2")["world_size"] == 2


def test_a_failure_on_one_rank_fails_the_save_everywhere(saved_two_ranks):
    _, (r0, r1) = saved_two_ranks
    assert r1["failed_save"][:2] == ("OSError", "[Errno 28] No space left on device")
    assert r0["failed_save"][0] == "RuntimeError"
    assert "failed on rank(s) 1: OSError(28, 'No space left on device')" in r0["failed_save"][1]
    assert r0["failed_save"][2] < 30 and r1["failed_save"][2] < 30  # no waiting for the 60 s timeout
    assert r0["latest_after_failed_save"] == r1["latest_after_failed_save"] == 3


def test_two_rank_checkpoint_loads_on_one_rank(saved_two_ranks):
    root, two = saved_two_ranks
    (one,) = run_distributed(_load_one_rank_worker, 1, str(root))
    for sharded in (True, False):
        got = one[sharded]
        _assert_identical(two[0]["saved"], got["snapshot"])
        assert got["extra"] == two[0]["saved_extra"]
        # Each rank's rows land in a slice of the one-rank tensor (a contiguous narrow along dim 0): still in place.
        # (Both ranks' chunks of each sharded tensor; replicated ones, such as Adam's step counts, were saved once.)
        assert got["load_direct"][0] == got["load_direct"][1] > two[0]["load_direct"][1]
        # Same weights and moments: the full-batch loss is the mean of the two ranks' half-batch losses, and the
        # update that follows (which reads the Adam moments) lands at the same loss.
        loss_a = sum(r["continuation"][0] for r in two) / 2
        loss_b = sum(r["continuation"][1] for r in two) / 2
        assert got["continuation"][0] == pytest.approx(loss_a, abs=1e-6)
        assert got["continuation"][1] == pytest.approx(loss_b, abs=1e-5)


# ---------------------------------------------------------------- single process: no process group, tiny model
def _tiny(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def _save(mgr: CheckpointManager, step: int, seed: int = 0, **extra) -> torch.nn.Module:
    model, opt = _tiny(seed)
    mgr.save(step, models={"m": model}, optimizers={"m": opt}, extra={"step": step, **extra})
    return model


def _load(mgr: CheckpointManager, step: int) -> tuple[torch.nn.Module, dict]:
    model, opt = _tiny(99)
    extra = mgr.load(step, models={"m": model}, optimizers={"m": opt})
    return model, extra


def test_uncommitted_directories_are_invisible(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=0)
    assert mgr.latest_committed() is None and mgr.list_committed() == []
    _save(mgr, 5)
    # A crash mid-save leaves a tmp dir with partial files; one after the rename leaves step-N without a marker.
    (tmp_path / "step-10.tmp-0123abcd" / "dcp").mkdir(parents=True)
    (tmp_path / "step-10.tmp-0123abcd" / "dcp" / "__0_0.distcp").write_bytes(b"partial")
    (tmp_path / "step-20").mkdir()
    (tmp_path / "step-20" / "extra.pt").write_bytes(b"partial")
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert mgr.latest_committed() == 5
    assert mgr.list_committed() == [5]
    with pytest.raises(RunStateError, match=r"no committed checkpoint at step 20 .*committed steps: \[5\]"):
        _load(mgr, 20)
    model, extra = _load(mgr, mgr.latest_committed())
    assert extra == {"step": 5}
    # The next successful save clears the debris (keep_last=0 keeps every committed checkpoint).
    _save(mgr, 6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "step-5", "step-6"]


def test_crash_while_replacing_a_step_keeps_previous_latest(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=0)
    _save(mgr, 3)
    # Crash between "set the old step-4 aside" and "rename the new one in": only aside/tmp copies exist.
    _save(mgr, 4)
    os.rename(tmp_path / "step-4", tmp_path / "step-4.old-deadbeef")
    (tmp_path / "step-4.tmp-cafe0001").mkdir()
    assert mgr.latest_committed() == 3
    mgr.prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-3"]


def test_saving_the_same_step_again_replaces_it(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    _save(mgr, 7, seed=1, branch="first")
    second = _save(mgr, 7, seed=2, branch="second")  # after a rollback the run reaches step 7 again
    model, extra = _load(mgr, 7)
    assert extra["branch"] == "second"
    assert torch.equal(model.weight, second.weight)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-7"]  # no aside/tmp copies left


@pytest.mark.parametrize(("keep_last", "expected"), [(0, [1, 2, 3, 4, 5]), (1, [5]), (2, [4, 5])])
def test_retention(tmp_path, keep_last, expected):
    mgr = CheckpointManager(tmp_path, keep_last=keep_last)
    for step in range(1, 6):
        _save(mgr, step)
        assert mgr.latest_committed() == step  # the newest is never pruned
    assert mgr.list_committed() == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"step-{s}" for s in expected]


def test_retention_never_deletes_the_newest_even_when_it_is_older(tmp_path):
    # The newest committed checkpoint is the highest step, whatever the order of writing.
    mgr = CheckpointManager(tmp_path, keep_last=1)
    _save(mgr, 9)
    _save(mgr, 4)
    assert mgr.list_committed() == [9]


def test_nothing_is_pruned_while_a_save_is_in_flight(tmp_path, monkeypatch):
    import hpcppo.distributed.checkpoint as ckpt

    mgr = CheckpointManager(tmp_path, keep_last=1)
    _save(mgr, 1)
    (tmp_path / "step-0.tmp-0badc0de").mkdir()  # debris an in-flight prune could otherwise see
    seen = {}
    real_save = ckpt.dcp.save

    def save_and_prune(*args, **kwargs):
        seen["removed"] = mgr.prune()
        seen["tmp_dirs"] = sorted(p.name for p in tmp_path.iterdir() if ".tmp-" in p.name)
        return real_save(*args, **kwargs)

    monkeypatch.setattr(ckpt.dcp, "save", save_and_prune)
    _save(mgr, 2)
    assert seen["removed"] == []
    assert len(seen["tmp_dirs"]) == 2  # the stale one and the in-flight one both survived
    assert mgr.list_committed() == [2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2"]


def test_extra_must_load_with_weights_only(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=0)
    with pytest.raises(TypeError, match=r"extra\['cursor'\]\['order'\].*weights_only=True"):
        _save(mgr, 1, cursor={"index": 3, "order": np.arange(4)})
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []  # refused before anything was written


def test_load_errors_name_what_is_missing(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=0)
    _save(mgr, 1)
    model, opt = _tiny()
    with pytest.raises(RunStateError, match=r"no models \['critic'\]; it holds \['m'\]"):
        mgr.load(1, models={"critic": model}, optimizers={})
    with pytest.raises(ValueError, match=r"optimizers \['x'\] have no model"):
        mgr.load(1, models={"m": model}, optimizers={"x": opt})
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=-1)


def test_partial_load_and_model_without_optimizer(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=0)
    actor, actor_opt = _tiny(1)
    critic, critic_opt = _tiny(2)
    ref, _ = _tiny(3)
    mgr.save(1, models={"actor": actor, "critic": critic, "ref": ref},
             optimizers={"actor": actor_opt, "critic": critic_opt}, extra={})
    # Restart only the critic (the watchdog's "value loss is NaN" action), and reload a frozen reference.
    critic2, critic_opt2 = _tiny(20)
    ref2 = torch.nn.Linear(4, 3)
    mgr.load(1, models={"critic": critic2, "ref": ref2}, optimizers={"critic": critic_opt2})
    assert torch.equal(critic2.weight, critic.weight) and torch.equal(ref2.weight, ref.weight)
    assert torch.equal(critic_opt2.state[critic2.weight]["exp_avg"], critic_opt.state[critic.weight]["exp_avg"])


def _tiny_column_major(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """``_tiny`` with the weight stored column-major (a dense, non-contiguous parameter; its Adam moments follow)."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    model.weight = torch.nn.Parameter(model.weight.detach().t().contiguous().t())
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def _same_state(a: tuple[torch.nn.Module, torch.optim.Optimizer], b: tuple[torch.nn.Module, torch.optim.Optimizer]):
    for (name, p), q in zip(a[0].named_parameters(), b[0].parameters()):
        assert torch.equal(p, q), name
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(a[1].state[p][key], b[1].state[q][key]), (name, key)


def test_tensors_that_cannot_be_read_in_place_take_dcp_own_path(tmp_path):
    """Chunks are read in place when the checkpoint records a layout this machine reads as is and the destination
    is contiguous; anything else is read by DCP's reader, with the same result."""
    mgr = CheckpointManager(tmp_path, keep_last=0)
    n = 8  # weight and bias, and for each its exp_avg, exp_avg_sq and step

    def round_trip(step: int, src, dst) -> tuple[int, int]:
        mgr.save(step, models={"m": src[0]}, optimizers={"m": src[1]}, extra={})
        mgr.load(step, models={"m": dst[0]}, optimizers={"m": dst[1]})
        _same_state(src, dst)
        return mgr.last_load_direct

    assert round_trip(1, _tiny(0), _tiny(99)) == (n, n)  # every tensor in place, 0-d step counts included
    assert layout.read_marker(mgr.step_dir(1))["tensor_layout"] == {"order": "contiguous", "byteorder": sys.byteorder}
    assert not _tiny_column_major()[0].weight.is_contiguous()
    # Stored from column-major tensors: saved row-major, so still read in place into row-major ones.
    assert round_trip(2, _tiny_column_major(0), _tiny(99)) == (n, n)
    # A column-major destination (the weight and its two moments) goes through DCP.
    assert round_trip(3, _tiny(0), _tiny_column_major(99)) == (n - 3, n)
    # A checkpoint whose marker records no layout (written before it was recorded), or another byte order.
    for edit in ({}, {"order": "contiguous", "byteorder": "big" if sys.byteorder == "little" else "little"}):
        src, dst = _tiny(0), _tiny(99)
        mgr.save(4, models={"m": src[0]}, optimizers={"m": src[1]}, extra={})
        marker = layout.read_marker(mgr.step_dir(4))
        del marker["tensor_layout"]
        layout.write_marker(mgr.step_dir(4), marker | ({"tensor_layout": edit} if edit else {}))
        mgr.load(4, models={"m": dst[0]}, optimizers={"m": dst[1]})
        _same_state(src, dst)
        assert mgr.last_load_direct == (0, n)


class _TouchOnUnpickle:
    """An object whose unpickling runs code: it creates ``path`` (a stand-in for anything worse)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return Path.touch, (self.path,)


def test_non_tensor_items_load_only_through_the_weights_only_unpickler(tmp_path):
    """DCP stores non-tensor state (optimizer param_groups) as pickles and its default planner unpickles them with
    weights_only=False; hpcppo's loads refuse any global outside torch's allowlist and call the item damage."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.state_dict import get_state_dict

    mgr = CheckpointManager(tmp_path / "checkpoints", keep_last=0)
    canary = tmp_path / "code-ran"
    model, opt = _tiny(0)
    opt.param_groups[0]["tag"] = _TouchOnUnpickle(canary)
    mgr.save(1, models={"m": model}, optimizers={"m": opt}, extra={})
    assert not canary.exists()
    dst, dst_opt = _tiny(99)
    dst_opt.param_groups[0]["tag"] = "a plain value"  # so the load asks for the item (as it does for "lr")
    with pytest.raises(CorruptCheckpointError, match=r"step-1/dcp is damaged: cannot be read on rank 0 "
                                                     r"\(UnpicklingError: .*Weights only load failed"):
        mgr.load(1, models={"m": dst}, optimizers={"m": dst_opt})
    assert not canary.exists()
    # The threat is real: DCP's own planner runs the payload when it reads the same checkpoint.
    models, optims = get_state_dict(dst, dst_opt)
    dcp.load({"model": {"m": models}, "optim": {"m": optims}},
             storage_reader=FileSystemReader(mgr.step_dir(1) / "dcp"), no_dist=True)
    assert canary.exists()


def test_rng_states_round_trip(tmp_path):
    import random

    mgr = CheckpointManager(tmp_path, keep_last=0)
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    _save(mgr, 1)
    expected = (torch.rand(2), random.random(), np.random.rand())
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    model, opt = _tiny(7)  # the load below must restore what save() captured, not this
    mgr.load(1, models={"m": model}, optimizers={"m": opt})
    assert torch.equal(torch.rand(2), expected[0])
    assert random.random() == expected[1]
    assert np.random.rand() == expected[2]


def test_marker_and_layout_helpers(tmp_path):
    mgr = CheckpointManager(tmp_path / "run" / "checkpoints", keep_last=0)
    _save(mgr, 12)
    assert layout.checkpoint_dir_for(tmp_path / "run", 12) == mgr.step_dir(12)
    marker = layout.read_marker(mgr.step_dir(12))
    assert marker["step"] == 12 and marker["world_size"] == 1 and marker["models"] == ["m"]
    assert layout.latest_committed(tmp_path / "run" / "checkpoints") == 12
    assert layout.parse_step("step-12") == 12 and layout.parse_step("step-12.tmp-ab") is None
    with pytest.raises(ValueError):
        layout.step_dir(tmp_path, -1)


def test_layout_does_not_import_torch():
    code = "import sys, hpcppo.rundir.checkpoints; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_abandon_after_rollback_hides_the_old_branch(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=0)
    for step in (10, 20, 30):
        _save(mgr, step, branch="old")
    assert mgr.abandon_after(10) == [20, 30]
    assert mgr.latest_committed() == 10  # a requeue now resumes from the rollback target
    assert len(layout.abandoned_dirs(tmp_path)) == 2  # kept for a post-mortem (keep_last=0 keeps all)
    _save(mgr, 20, branch="new")
    assert mgr.list_committed() == [10, 20]
    assert _load(mgr, 20)[1]["branch"] == "new"
    assert len(layout.abandoned_dirs(tmp_path)) == 2
    mgr.keep_last = 2
    mgr.prune()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-10", "step-20"]


def test_an_optimizer_that_never_stepped_is_recorded_empty(tmp_path):
    """Saving must not create state for it (DCP would, with a zero-lr step), and loading restores it empty."""
    from hpcppo.rundir.checkpoints import read_marker

    mgr = CheckpointManager(tmp_path, keep_last=0)
    stepped_model, stepped = _tiny(1)
    fresh_model = torch.nn.Linear(4, 3)
    fresh = torch.optim.Adam(fresh_model.parameters(), lr=0.1)
    mgr.save(1, models={"a": fresh_model, "c": stepped_model}, optimizers={"a": fresh, "c": stepped}, extra={})
    assert not fresh.state
    marker = read_marker(mgr.step_dir(1))
    assert marker["optimizers"] == ["c"] and marker["empty_optimizers"] == ["a"]
    model2, opt2 = _tiny(5)  # has state: the load must take it back to "never stepped"
    critic2, critic_opt2 = _tiny(6)
    mgr.load(1, models={"a": model2, "c": critic2}, optimizers={"a": opt2, "c": critic_opt2})
    assert not opt2.state
    assert torch.equal(model2.weight, fresh_model.weight)
    assert torch.equal(critic_opt2.state[critic2.weight]["exp_avg"], stepped.state[stepped_model.weight]["exp_avg"])


# ---------------------------------------------------------------- damage: manifest, verify, fall back
def _overwrite_middle(path: Path, n: int = 64) -> None:
    """Random bytes over the middle of ``path``, its size unchanged (what only a checksum can see)."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + n] = bytes(b ^ 0xFF for b in data[mid:mid + n])  # every byte changes
    path.write_bytes(bytes(data))


def _drop_manifest(step_dir: Path) -> None:
    """Make ``step_dir`` look written before manifests existed."""
    marker = layout.read_marker(step_dir)
    del marker["files"]
    layout.write_marker(step_dir, marker)


def test_the_marker_records_every_file_with_its_size_and_crc32(tmp_path, monkeypatch):
    mgr = CheckpointManager(tmp_path, keep_last=0)
    read_back = []
    digest = layout.file_digest
    monkeypatch.setattr(layout, "file_digest", lambda path: read_back.append(Path(path).name) or digest(path))
    _save(mgr, 1)
    # The shard's entry comes from the bytes DCP wrote; only DCP's renamed .metadata is read back.
    assert read_back == [".metadata"]
    monkeypatch.undo()
    step = mgr.step_dir(1)
    files = layout.manifest(step)
    on_disk = sorted(str(p.relative_to(step)) for p in step.rglob("*") if p.is_file() and p.name != "COMMITTED")
    assert sorted(files) == on_disk == [
        "dcp/.metadata", "dcp/__0_0.distcp", "extra.pt", "rng-rank0.pt"]
    for name, record in files.items():
        assert record == layout.file_digest(step / name) == layout.file_record((step / name).read_bytes())
        assert set(record) == {"size", "crc32"} and len(record["crc32"]) == 8
    assert mgr.last_checksum_s is not None and mgr.last_checksum_s >= 0
    assert files["dcp/__0_0.distcp"]["crc32"] == f"{zlib.crc32((step / 'dcp/__0_0.distcp').read_bytes()):08x}"
    # The shard's items were torch.saved without their own per-record CRC-32 (the manifest's covers the bytes), and
    # the process-wide option is back on afterwards.
    with zipfile.ZipFile(step / "dcp/__0_0.distcp") as last_item:  # zipfile finds the file's last archive
        assert {info.CRC for info in last_item.infolist()} == {0}
    assert torch.serialization.get_crc32_options() is True
    buf = io.BytesIO()
    torch.save(torch.ones(3), buf)
    assert 0 not in {info.CRC for info in zipfile.ZipFile(buf).infolist()}


def test_zip_crc_is_switched_off_only_in_the_thread_that_writes(tmp_path, monkeypatch):
    from torch.distributed.checkpoint import FileSystemWriter

    seen = {}
    write_data = FileSystemWriter.write_data

    def spy(self, plan, planner):
        seen["writer"] = torch.serialization.get_crc32_options()
        other = threading.Thread(target=lambda: seen.setdefault("another thread", torch.serialization.get_crc32_options()))
        other.start()
        other.join()
        return write_data(self, plan, planner)

    monkeypatch.setattr(FileSystemWriter, "write_data", spy)
    _save(CheckpointManager(tmp_path, keep_last=0), 1)
    assert seen == {"writer": False, "another thread": True}
    assert torch.serialization.get_crc32_options() is True


def test_random_bytes_over_extra_pt_are_found_before_anything_loads(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=0)
    _save(mgr, 1)
    extra = mgr.step_dir(1) / "extra.pt"
    extra.write_bytes(os.urandom(extra.stat().st_size))  # same size: only the checksum tells
    message = rf"checkpoint {extra} is damaged: crc32 [0-9a-f]{{8}}, [0-9a-f]{{8}} was written"
    with pytest.raises(CorruptCheckpointError, match=message) as info:
        mgr.verify(1)  # extra.pt's checksum is always checked (kilobytes)
    assert (info.value.step, info.value.file, info.value.exit_code) == (1, "extra.pt", RunStateError.exit_code)
    model, opt = _tiny(99)
    before = model.weight.detach().clone()
    with pytest.raises(CorruptCheckpointError, match=message):
        mgr.load(1, models={"m": model}, optimizers={"m": opt})
    assert torch.equal(model.weight, before)  # refused before DCP touched the model
    extra.write_bytes(os.urandom(100))
    with pytest.raises(CorruptCheckpointError, match=r"extra.pt is damaged: 100 bytes, \d+ were written"):
        mgr.verify(1)


def test_a_truncated_shard_is_found_by_its_size_and_overwritten_bytes_by_the_checksum(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=0)
    _save(mgr, 1)
    shard = mgr.step_dir(1) / "dcp" / "__0_0.distcp"
    size = shard.stat().st_size
    _overwrite_middle(shard)
    mgr.verify(1)  # sizes only (what every load checks): the shards' checksums cost a read of every shard
    with pytest.raises(CorruptCheckpointError, match=r"__0_0.distcp is damaged: crc32 .* changed after the commit"):
        mgr.verify(1, shards=True)
    os.truncate(shard, size // 2)
    with pytest.raises(CorruptCheckpointError, match=rf"__0_0.distcp is damaged: {size // 2} bytes, {size} were"):
        mgr.verify(1)


def test_a_missing_file_is_damage_and_an_extra_file_is_ignored(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=0)
    _save(mgr, 1)
    step = mgr.step_dir(1)
    (step / "notes.txt").write_text("a user's notes")
    (step / "dcp" / "__7_0.distcp").write_bytes(b"not listed")
    mgr.verify(1, shards=True)
    _load(mgr, 1)
    (step / "rng-rank0.pt").unlink()
    with pytest.raises(CorruptCheckpointError, match=r"rng-rank0.pt is damaged: missing$"):
        mgr.verify(1)


def test_checkpoints_without_a_manifest_are_trusted_and_unreadable_files_still_named(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=0)
    for step in (1, 2, 3):
        _save(mgr, step)
        _drop_manifest(mgr.step_dir(step))
        mgr.verify(step, shards=True)  # nothing recorded, nothing to compare
    assert _load(mgr, 1)[1] == {"step": 1}
    (mgr.step_dir(2) / "extra.pt").write_bytes(os.urandom(300))
    with pytest.raises(CorruptCheckpointError, match=r"step-2/extra.pt is damaged: cannot be read \(\w+Error: "):
        _load(mgr, 2)
    shard = mgr.step_dir(3) / "dcp" / "__0_0.distcp"
    os.truncate(shard, shard.stat().st_size // 2)
    with pytest.raises(CorruptCheckpointError, match=r"step-3/dcp is damaged: cannot be read on rank 0 \(\w+"):
        _load(mgr, 3)


def test_an_unreadable_marker_is_damage(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=0)
    _save(mgr, 1)
    (mgr.step_dir(1) / "COMMITTED").write_bytes(b"\x00{not json")
    with pytest.raises(CorruptCheckpointError, match=r"step-1/COMMITTED is damaged: unreadable \("):
        mgr.verify(1)


def test_a_state_dict_mismatch_is_not_damage(tmp_path):
    """Only bytes that cannot be read count as damage; a model that does not fit the checkpoint is another error
    (falling back would set good checkpoints aside)."""
    mgr = CheckpointManager(tmp_path, keep_last=0)
    _save(mgr, 1)
    with pytest.raises(BaseException, match="Size mismatch") as info:
        mgr.load(1, models={"m": torch.nn.Linear(4, 5)}, optimizers={})
    assert not isinstance(info.value, CorruptCheckpointError)
    with pytest.raises(BaseException, match="Size mismatch"):
        mgr.load_newest_intact(models={"m": torch.nn.Linear(4, 5)}, optimizers={})
    assert mgr.list_committed() == [1] and not layout.corrupt_dirs(tmp_path)


def test_resume_falls_back_past_damaged_checkpoints_and_sets_them_aside(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=0)
    models = {s: _save(mgr, s, seed=s) for s in (2, 4, 6, 8)}
    (mgr.step_dir(8) / "extra.pt").write_bytes(os.urandom(50))
    _overwrite_middle(mgr.step_dir(6) / "dcp" / "__0_0.distcp")  # only the shards' checksums see this one
    model, opt = _tiny(99)
    resumed = mgr.load_newest_intact(models={"m": model}, optimizers={"m": opt})
    assert resumed.step == 4 and resumed.extra == {"step": 4}
    assert torch.equal(model.weight, models[4].weight)
    assert [(e.step, e.file) for e in resumed.damaged] == [(8, "extra.pt"), (6, "dcp/__0_0.distcp")]
    assert mgr.list_committed() == [2, 4] and mgr.latest_committed() == 4
    aside = layout.corrupt_dirs(tmp_path)
    assert [e.set_aside_as for e in resumed.damaged] == sorted(aside, reverse=True)  # step-8.corrupt-*, step-6...
    assert [p.name.split(".")[0] for p in aside] == ["step-6", "step-8"]
    assert (aside[1] / "COMMITTED").exists()  # moved whole, for a post-mortem
    # The run re-reaches step 6 and 8; retention never deletes what was set aside.
    mgr.keep_last = 1
    _save(mgr, 6)
    assert mgr.list_committed() == [6] and layout.corrupt_dirs(tmp_path) == aside


def test_resume_with_every_checkpoint_damaged_fails_and_moves_nothing(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=0)
    for step in (1, 2):
        _save(mgr, step)
        (mgr.step_dir(step) / "extra.pt").write_bytes(b"junk")
    before = sorted(p.name for p in tmp_path.iterdir())
    model, opt = _tiny(99)
    with pytest.raises(NoIntactCheckpointError) as info:
        mgr.load_newest_intact(models={"m": model}, optimizers={"m": opt})
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, RunStateError)
    assert message.startswith(f"no intact checkpoint to resume from in {tmp_path} (step 2: extra.pt: 4 bytes, ")
    assert "; step 1: extra.pt: 4 bytes" in message and "start again from step 0" in message
    assert [e.step for e in info.value.damaged] == [2, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert CheckpointManager(tmp_path / "empty", keep_last=0).load_newest_intact(models={}, optimizers={}) is None


def _fallback_worker(rank: int, world: int, root: str) -> dict:
    """Damage that only one rank can see, on 2 ranks: both must take the same decision."""
    from hpcppo.distributed.env import barrier

    actor, critic, ref, actor_opt, critic_opt, sched = _build(world, seed=0)
    models, opts = _models(actor, critic, ref, actor_opt, critic_opt)
    mgr = CheckpointManager(root, keep_last=0)
    out: dict = {}
    for step in (1, 2, 3):
        _train_step(actor, critic, actor_opt, critic_opt, sched, batch(step).chunk(world)[rank])
        mgr.save(step, models=models, optimizers=opts, extra={"step": step})
        if step == 1:
            out["saved_1"] = _snapshot(actor, actor_opt)
    out["manifest"] = layout.manifest(mgr.step_dir(3))
    barrier()
    if rank == 0:
        step3, step2 = Path(root) / "step-3", Path(root) / "step-2"
        # Step 3: bytes changed inside rank 1's shard; rank 1 alone checks that file.
        _overwrite_middle(step3 / "dcp" / "__1_0.distcp")
        # Step 2: no manifest (an old checkpoint) and junk in rank 1's RNG file; rank 1 alone reads it, after DCP
        # has loaded step 2's weights everywhere.
        _drop_manifest(step2)
        (step2 / "rng-rank1.pt").write_bytes(os.urandom(64))
    barrier()
    actor2, critic2, ref2, actor_opt2, critic_opt2, _ = _build(world, seed=10)
    models2, opts2 = _models(actor2, critic2, ref2, actor_opt2, critic_opt2)
    resumed = mgr.load_newest_intact(models=models2, optimizers=opts2)
    out["resumed"] = (resumed.step, resumed.extra, [(e.step, e.file, e.reason) for e in resumed.damaged],
                      [e.set_aside_as.name for e in resumed.damaged])
    out["loaded_1"] = _snapshot(actor2, actor_opt2)
    out["committed"] = mgr.list_committed()
    return out


def test_damage_one_rank_sees_makes_every_rank_fall_back_alike(tmp_path):
    r0, r1 = run_distributed(_fallback_worker, 2, str(tmp_path / "checkpoints"))
    assert sorted(r0["manifest"]) == ["dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp", "extra.pt",
                                      "rng-rank0.pt", "rng-rank1.pt"]  # every rank's files, gathered by rank 0
    assert r0["resumed"] == r1["resumed"]  # the same decision, the same names
    step, extra, damaged, aside = r0["resumed"]
    assert step == 1 and extra == {"step": 1}
    assert [d[:2] for d in damaged] == [(3, "dcp/__1_0.distcp"), (2, "rng-rank1.pt")]
    assert damaged[0][2].startswith("crc32 ") and damaged[1][2].startswith("cannot be read (")
    assert [a.split(".")[0] for a in aside] == ["step-3", "step-2"]
    assert r0["committed"] == r1["committed"] == [1]
    for r in (r0, r1):  # step 2's weights, loaded before its RNG file failed, are all replaced by step 1's
        _assert_identical(r["saved_1"], r["loaded_1"])
