"""optimizer_offload without param_offload, end to end on 2 ranks: the actor's and the critic's AdamW state
travel to the host between updates and back before the steps, and the numbers do not change by a bit; a
checkpoint written while the state sat on the host resumes (the state goes back to the host after loading) and
continues exactly as the straight run. On the CPU the host and the device are the same memory, so this checks the
wiring and the arithmetic; tests/gpu/test_optim_offload_cuda.py checks the memory leaving the GPU."""

from __future__ import annotations

import shutil

import pytest
import torch

from hpcppo import metrics as hmetrics

from _harness import (comparable, compile_run, final_weights, launch_ranks, logs_of, wait_all, wait_for_commit,
                      write_spec)

OFFLOAD = ["actor.fsdp.optimizer_offload=true", "critic.fsdp.optimizer_offload=true"]
# 3 steps; a checkpoint after step 2 (while the state sits on the host) and the final one after step 3.
SHORT = ["trainer.total_steps=3", "checkpoint.save_every=2"]


@pytest.mark.slow
def test_offloaded_optimizer_state_trains_and_resumes_like_the_plain_run(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    plain = compile_run(spec, tmp_path / "runs", SHORT)
    offloaded = compile_run(spec, tmp_path / "runs", SHORT + OFFLOAD)
    procs = {plain: launch_ranks(plain, 2, "a0"), offloaded: launch_ranks(offloaded, 2, "a0")}
    # As soon as the offloaded run has committed step 2, resume it in a fresh run with the flag on (overlapping
    # the rest of the other runs keeps the test short): its step 3 must equal the straight runs' step 3.
    wait_for_commit(offloaded, 2, procs[offloaded])
    resumed = compile_run(spec, tmp_path / "runs", SHORT + OFFLOAD)
    shutil.copytree(offloaded / "checkpoints" / "step-2", resumed / "checkpoints" / "step-2")
    procs[resumed] = launch_ranks(resumed, 2, "a0")
    for run, ranks in procs.items():
        assert wait_all(ranks) == [0, 0], logs_of(run)

    a, b = hmetrics.load(plain), hmetrics.load(offloaded)
    assert list(b["step"]) == [1, 2, 3]
    assert b["critic/vf_loss"].notna().all() and b["actor/pg_loss"].notna().all()  # both optimizers stepped
    ca, cb = comparable(a), comparable(b)
    assert ca.equals(cb), (ca - cb).abs().max().sort_values().tail(10)
    wa, wb = final_weights(plain, 3), final_weights(offloaded, 3)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key

    log = logs_of(resumed)
    assert "resumed from checkpoint step 2" in log
    assert "actor optimizer state offloaded to host memory" in log
    assert "critic optimizer state offloaded to host memory" in log
    c = hmetrics.load(resumed)
    assert list(c["step"]) == [3]
    cc, ca3 = comparable(c), ca.loc[[3], comparable(c).columns]
    assert cc.equals(ca3), (cc - ca3).abs().max().sort_values().tail(10)
    wc = final_weights(resumed, 3)
    for key in wa:
        assert torch.equal(wa[key], wc[key]), key
