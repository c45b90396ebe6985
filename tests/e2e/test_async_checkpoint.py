"""Background checkpoints in the real job (``checkpoint.async_save = true``, 2 ranks): the numbers are those of a run
with synchronous checkpoints, bit for bit, and a rank killed while a background save is being written leaves the
previous checkpoint as the newest committed one; the requeued attempt resumes from it and ends where the
synchronous run ends."""

from __future__ import annotations

import pytest
from _harness import comparable, compile_run, final_weights, launch_ranks, logs_of, wait_all, write_spec

from hpcppo import metrics as hmetrics

STEPS = 6
KILLED = -9


def _run(tmp_path, tiny, name: str, overrides: list[str]):
    spec = write_spec(tmp_path / f"{name}.toml", tiny, name=name)
    return compile_run(spec, tmp_path / "runs", ["checkpoint.save_every=2", *overrides])


@pytest.mark.slow
def test_background_checkpoints_keep_the_numbers_and_survive_a_kill_mid_write(tmp_path, random_tiny):
    sync = _run(tmp_path, random_tiny, "sync", [])
    assert wait_all(launch_ranks(sync, 2, "a0")) == [0, 0], logs_of(sync)

    run = _run(tmp_path, random_tiny, "async", ["checkpoint.async_save=true", "debug.inject.kill_rank=0",
                                                "debug.inject.kill_in_checkpoint_at_step=4"])
    codes = wait_all(launch_ranks(run, 2, "a0"))
    first = logs_of(run)
    assert codes[0] == KILLED and codes[1] not in (0, KILLED), (codes, first)
    assert "kills itself while writing checkpoint" in first, first
    ckpts = run / "checkpoints"
    committed = sorted(p.name for p in ckpts.iterdir() if (p / "COMMITTED").exists())
    assert committed == ["step-2"], list(ckpts.iterdir())  # step 4 was in flight: never committed
    assert [p.name.split(".tmp-")[0] for p in ckpts.iterdir() if ".tmp-" in p.name] == ["step-4"]

    assert wait_all(launch_ranks(run, 2, "a1")) == [0, 0], logs_of(run)
    logs = logs_of(run)
    assert "resumed from checkpoint step 2" in logs, logs
    assert "checkpoint step 2 saved in" in first and "s of it blocking" in first, first  # written in the background
    df = hmetrics.load(run)
    assert list(df["step"]) == list(range(1, STEPS + 1))
    ref, got = comparable(hmetrics.load(sync)), comparable(df)
    assert ref.equals(got), (ref - got).abs().max().sort_values().tail(10)
    want, have = final_weights(sync, STEPS), final_weights(run, STEPS)
    assert want.keys() == have.keys() and all(want[k].equal(have[k]) for k in want)
    # background saves of steps 2 and 4 (attempt 1) committed; the final one (6) was synchronous; no debris left
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-2", "step-4", "step-6"], list(ckpts.iterdir())


@pytest.mark.slow
def test_a_clean_exit_lets_the_background_save_in_flight_commit(tmp_path, random_tiny):
    """A preemption with save_on_preempt = false writes no checkpoint of its own, so a background save of the step
    before may still be in flight when train() returns: the job commits it before exiting instead of dropping it."""
    import signal
    import time

    from hpcppo.rundir import exitcodes

    run = _run(tmp_path, random_tiny, "settle", ["checkpoint.async_save=true", "checkpoint.save_every=1",
                                                 "checkpoint.save_on_preempt=false", "trainer.total_steps=200"])
    procs = launch_ranks(run, 2, "a0")
    deadline = time.monotonic() + 240
    while not list((run / "metrics").glob("*.h5")) or len(hmetrics.load(run)) < 3:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), logs_of(run)
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGUSR2)
    assert wait_all(procs) == [exitcodes.REQUEUE] * 2, logs_of(run)
    ckpts = run / "checkpoints"
    assert not [p.name for p in ckpts.iterdir() if ".tmp-" in p.name], list(ckpts.iterdir())
    committed = sorted(int(p.name.split("-")[1]) for p in ckpts.iterdir() if (p / "COMMITTED").exists())
    last = int(hmetrics.load(run)["step"].max())
    assert committed and committed[-1] == last, (committed, last)  # every step saved, the last one included
