"""Checkpoint/resume beyond the fault matrix (``test_faults.py``): a 2-rank checkpoint resumes on 1 rank; a
preemption signal while the models load; export loads; a pause and a resume through the CLI; checkpoints during
the critic's warm-up change nothing."""

from __future__ import annotations

import shutil
import signal
import time

import pytest
import torch

from hpcppo import metrics as hmetrics
from hpcppo.rundir import control, exitcodes

from _harness import (comparable, compile_run, final_weights, kill_at_commit, launch_ranks, logs_of, wait_all,
                      write_spec)


@pytest.mark.slow
def test_two_rank_checkpoint_resumes_on_one_rank(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny, extra="")
    two = compile_run(spec, tmp_path / "runs", ["trainer.total_steps=3"])
    assert wait_all(launch_ranks(two, 2, "a0")) == [0, 0], logs_of(two)
    one = compile_run(spec, tmp_path / "runs", ["site.local.procs_per_node=1", "trainer.total_steps=5",
                                                "checkpoint.save_every=5"])
    shutil.copytree(two / "checkpoints" / "step-3", one / "checkpoints" / "step-3")
    assert wait_all(launch_ranks(one, 1, "a0")) == [0], logs_of(one)
    df = hmetrics.load(one)
    assert list(df["step"]) == [4, 5]
    assert (one / "checkpoints" / "step-5" / "COMMITTED").exists()
    assert "resumed from checkpoint step 3" in logs_of(one)


@pytest.mark.slow
def test_preemption_signal_while_the_models_load_is_kept(tmp_path, random_tiny):
    """Slurm's USR2 can come before the first step (a 7B model loads for minutes): the rank must not die of
    it; the job leaves with the requeue code, and with nothing trained there is nothing to checkpoint."""
    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    run = compile_run(spec, tmp_path / "runs", ["trainer.total_steps=200", "checkpoint.save_every=0"])
    procs = launch_ranks(run, 2, "a0")
    log = run / "logs" / "rank-a0-1.log"
    deadline = time.monotonic() + 120
    while "Loading weights" not in log.read_text(errors="replace"):  # the first thing build_components prints
        assert time.monotonic() < deadline and procs[1].poll() is None, logs_of(run)
        time.sleep(0.02)
    procs[1].send_signal(signal.SIGUSR2)
    assert wait_all(procs) == [exitcodes.REQUEUE] * 2, logs_of(run)
    events = hmetrics.load_events(run)
    assert list(events["kind"]) == ["preempted"], events
    rows = hmetrics.load(run)
    committed = [p for p in (run / "checkpoints").iterdir() if (p / "COMMITTED").exists()] \
        if (run / "checkpoints").exists() else []
    assert len(committed) == (1 if len(rows) else 0), (len(rows), committed)


@pytest.mark.slow
def test_export_loads_with_from_pretrained(tmp_path, random_tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hpcppo.cli import main

    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    run = compile_run(spec, tmp_path / "runs", ["trainer.total_steps=2", "checkpoint.save_every=0"])
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    out = tmp_path / "exported"
    assert main(["export", run.name, "--runs-root", str(run.parent), "--out", str(out)]) == 0
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    weights = final_weights(run, 2)
    for name, value in model.state_dict().items():
        assert torch.equal(value, weights[f"actor.{name}"]), name
    ids = tok("1+2=", return_tensors="pt").input_ids
    assert model(ids).logits.shape[-1] == len(tok)


@pytest.mark.slow
def test_pause_request_then_resume_through_the_cli(tmp_path, random_tiny, capsys):
    from hpcppo.cli import main
    from hpcppo.launch.status import run_status
    from hpcppo.rundir import RunDir

    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    paused = compile_run(spec, tmp_path / "runs", ["trainer.total_steps=6", "checkpoint.save_every=0"])
    procs = launch_ranks(paused, 2, "a0")
    deadline = time.monotonic() + 240
    while not list((paused / "metrics").glob("*.h5")) or len(hmetrics.load(paused)) < 1:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), logs_of(paused)
        time.sleep(0.1)
    control.request_pause(paused, "operator: inspecting the KL")
    assert wait_all(procs) == [exitcodes.PAUSED] * 2, logs_of(paused)
    stopped_at = int((paused / "control" / "PAUSED").read_text().split(":")[0].split()[1])
    assert 1 <= stopped_at < 6 and (paused / "checkpoints" / f"step-{stopped_at}" / "COMMITTED").exists()
    assert not (paused / "control" / "PAUSE").exists()
    st = run_status(RunDir(paused))
    assert st.state in ("PAUSED", "NOT_SUBMITTED") or st.paused
    capsys.readouterr()
    assert main(["resume", paused.name, "--runs-root", str(paused.parent), "--wait"]) == 0, logs_of(paused)
    out = capsys.readouterr().out
    assert "COMPLETED" in out
    df = hmetrics.load(paused)
    assert list(df["step"]) == [1, 2, 3, 4, 5, 6] and sorted(set(df["attempt"])) == [0, 1]
    assert not (paused / "control" / "PAUSED").exists()
    assert "paused" in set(hmetrics.load_events(paused)["kind"])


@pytest.mark.slow
def test_checkpoints_during_critic_warmup_change_nothing(tmp_path, random_tiny):
    """While the critic warms up the actor's optimizer has no state: a checkpoint leaves it out (asking DCP for it
    would create state with a zero-lr step, i.e. one more Adam step) and a resume from such a checkpoint continues
    exactly like a run that never stopped."""
    from hpcppo.rundir.checkpoints import read_marker

    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    common = ["critic.warmup_updates=2", "trainer.total_steps=4"]
    plain = compile_run(spec, tmp_path / "runs", common + ["checkpoint.save_every=0"])
    often = compile_run(spec, tmp_path / "runs", common + ["checkpoint.save_every=1"])
    plain_procs = launch_ranks(plain, 2, "a0")
    kill_at_commit(often, 2, launch_ranks(often, 2, "a0"))
    assert read_marker(often / "checkpoints" / "step-1")["optimizers"] == ["critic"]
    assert wait_all(launch_ranks(often, 2, "a1")) == [0, 0], logs_of(often)
    assert wait_all(plain_procs) == [0, 0], logs_of(plain)
    assert read_marker(often / "checkpoints" / "step-4")["optimizers"] == ["actor", "critic"]
    ca, cb = comparable(hmetrics.load(plain)), comparable(hmetrics.load(often))
    assert list(cb.index) == [1, 2, 3, 4]
    assert ca.equals(cb), (ca - cb).abs().max().sort_values().tail(10)


@pytest.mark.slow
def test_a_resumed_run_shows_each_step_once_in_tensorboard(tmp_path, random_tiny):
    """Attempt 0 logs steps 1-3 and dies at step 4 (checkpoint 2); attempt 1 replays 3 and goes on. The run's live
    tensorboard/ then held step 3 twice (TensorBoard drew a zigzag): each step once now, as the HDF5 log's current
    history has it."""
    from hpcppo.rundir import RunPaths
    from trackerfiles import tensorboard_scalars

    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    run = compile_run(spec, tmp_path / "runs", [
        "trainer.logger=['console','tensorboard']", "trainer.total_steps=4", "checkpoint.save_every=2",
        "debug.inject.kill_rank_at_step=4", "debug.inject.kill_rank=1"])
    assert wait_all(launch_ranks(run, 2, "a0")) != [0, 0], logs_of(run)
    assert 3 in set(hmetrics.load(run, attempts="all", branches="all")["step"]), logs_of(run)  # logged, then lost
    assert wait_all(launch_ranks(run, 2, "a1")) == [0, 0], logs_of(run)
    history = hmetrics.load(run).set_index("step")
    tb = tensorboard_scalars(RunPaths(run).tensorboard)["reward/mean"]
    assert [s for s, _ in tb] == [1, 2, 3, 4], tb
    assert [v for _, v in tb] == pytest.approx(history.loc[[1, 2, 3, 4], "reward/mean"].tolist())
