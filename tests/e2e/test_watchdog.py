"""The watchdog's rules enforced inside the real trainer (2 ranks, gloo), proven by fault injection
(``[debug.inject]``): each default rule fires on its fault, the run recovers and reaches its last step, no
metrics row is lost, every action is recorded (HDF5 events and ``events.jsonl``), and a run killed after a
rollback and resumed equals the straight run bit for bit. Also ``hpcppo rollback`` through the control inbox,
on a stopped run and on a running one."""

from __future__ import annotations

import json

import h5py
import pytest

from hpcppo import metrics as hmetrics
from hpcppo.cli import main
from hpcppo.rundir import control, events

from _harness import (REPO, comparable, compile_run, final_weights, kill_at_commit, launch_ranks, logs_of, wait_all,
                      wait_for_commit, write_spec)

# A reference model makes kl/actor_ref real; a small lr keeps this random model's natural KL far below the
# default thresholds (0.05) over these few steps, so only the injected faults trip the rules.
KL_SPEC = """
[algorithm]
use_kl_in_reward = true
"""
BASE = ["actor.lr=2e-5", "trainer.total_steps=8", "checkpoint.save_every=2"]


def _all_rows(run_dir):
    """Every row of every attempt, abandoned branches included: (step, branch) pairs in file order."""
    rows = []
    for path in sorted((run_dir / "metrics").glob("attempt-*.h5")):
        with h5py.File(path, "r", locking=False) as f:
            n = int((f["step"][:] >= 0).sum())
            rows += list(zip(f["step"][:n].tolist(), f["branch"][:n].tolist()))
    return rows


def _rule(name, metric, action, *, condition="gt", threshold=0.0, **fields):
    """A ``[[watchdog.rules]]`` table for a test spec (always firing with the defaults: ``metric > 0``)."""
    lines = [f'name = "{name}"', f'metric = "{metric}"', f'condition = "{condition}"', f"threshold = {threshold}",
             f'action = "{action}"'] + [f"{k} = {v}" for k, v in fields.items()]
    return "\n[[watchdog.rules]]\n" + "\n".join(lines) + "\n"


def _watchdog_state(run_dir, step):
    """The rule state saved in checkpoint ``step``."""
    import torch

    return torch.load(run_dir / "checkpoints" / f"step-{step}" / "extra.pt", weights_only=True)["watchdog"]["state"]


def _kinds(run_dir):
    return [(e["kind"], e["step"]) for e in events.read_events(run_dir)]


@pytest.mark.slow
def test_kl_spike_rolls_back_raises_kl_coef_and_a_killed_run_resumes_identically(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny, extra=KL_SPEC)
    overrides = BASE + ["debug.inject.kl_spike_at_step=5"]
    straight = compile_run(spec, tmp_path / "runs", overrides)
    assert wait_all(launch_ranks(straight, 2, "a0")) == [0, 0], logs_of(straight)

    df = hmetrics.load(straight)
    assert list(df["step"]) == list(range(1, 9))
    # The spike row stays in the log, on the abandoned branch; the retried step 5 is clean.
    rows = _all_rows(straight)
    assert (5, 0) in rows and (5, 1) in rows and rows.index((5, 1)) > rows.index((5, 0))
    assert df.set_index("step").loc[5, "kl/actor_ref"] < 0.05
    # Both rules on the KL rule fired on step 5: back to checkpoint 4 (the newest before the anomaly) with lr x0.5,
    # and the KL coefficient x1.5 on the retried branch.
    recorded = events.read_events(straight)
    rollback = next(e for e in recorded if e["kind"] == "watchdog.rollback")
    assert (rollback["step"], rollback["checkpoint"], rollback["rule"], rollback["value"]) == (5, 4, "kl_rollback", 0.08)
    raised = next(e for e in recorded if e["kind"] == "watchdog.raise_kl_coef")
    assert raised["old"] == pytest.approx(0.001) and raised["new"] == pytest.approx(0.0015)
    by_step = df.set_index("step")
    assert (by_step.loc[[1, 2, 3, 4], "kl/coef"] == 0.001).all()
    assert by_step.loc[[5, 6, 7, 8], "kl/coef"].tolist() == pytest.approx([0.0015] * 4)
    assert by_step.loc[4, "actor/lr"] == pytest.approx(2e-5) and by_step.loc[5, "actor/lr"] == pytest.approx(1e-5)
    assert {"watchdog.rollback", "watchdog.raise_kl_coef"} <= set(hmetrics.load_events(straight)["kind"])

    # Killed after the rollback (at the commit of step 6 on the new branch) and resumed: the same run.
    resumed = compile_run(spec, tmp_path / "runs", overrides)
    kill_at_commit(resumed, 6, launch_ranks(resumed, 2, "a0"))
    assert wait_all(launch_ranks(resumed, 2, "a1")) == [0, 0], logs_of(resumed)
    a, b = comparable(hmetrics.load(straight)), comparable(hmetrics.load(resumed))
    assert a.equals(b), (a - b).abs().max().sort_values().tail(10)
    wa, wb = final_weights(straight, 8), final_weights(resumed, 8)
    assert all((wa[k] == wb[k]).all() for k in wa)


@pytest.mark.slow
def test_nan_critic_is_restarted_from_its_last_checkpoint(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    run = compile_run(spec, tmp_path / "runs", BASE + ["trainer.total_steps=6", "debug.inject.nan_value_loss_at_step=3"])
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    df = hmetrics.load(run).set_index("step")
    assert list(df.index) == list(range(1, 7))
    assert df["critic/vf_loss"].isna().tolist() == [False, False, True, False, False, False]
    (restart,) = [e for e in events.read_events(run) if e["kind"] == "watchdog.restart_critic"]
    assert (restart["step"], restart["checkpoint"], restart["rule"], restart["value"]) == (3, 2, "value_loss_nonfinite", "nan")
    # The actor was left alone: no rollback, one branch.
    assert {b for _, b in _all_rows(run)} == {0}
    assert df.loc[[4, 5, 6], "critic/values_mean"].notna().all()


@pytest.mark.slow
def test_reward_collapse_rolls_back_and_the_example_still_learns(tmp_path, warm_tiny):
    root, _ = warm_tiny
    spec = REPO / "examples" / "arith-tiny.toml"
    run = compile_run(spec, tmp_path / "runs", [
        f"model.path={root / 'model'}", f"data.train_files=['{root / 'data' / 'train.parquet'}']",
        f"data.val_files=['{root / 'data' / 'val.parquet'}']", "trainer.total_steps=14", "trainer.test_freq=0",
        "trainer.val_before_train=false", "checkpoint.save_every=5", "debug.inject.reward_collapse_at_step=12"])
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    df = hmetrics.load(run).set_index("step")
    assert list(df.index) == list(range(1, 15))
    (rollback,) = [e for e in events.read_events(run) if e["kind"] == "watchdog.rollback"]
    assert (rollback["step"], rollback["checkpoint"], rollback["rule"]) == (12, 10, "reward_drop_rollback")
    assert (12, 0) in _all_rows(run) and (12, 1) in _all_rows(run)
    # The retried steps are clean and the model kept learning: no collapse left in the current branch.
    assert df.loc[11:14, "reward/mean"].min() > 0.5 * df.loc[1:10, "reward/mean"].mean()


@pytest.mark.slow
def test_rollback_of_a_stopped_run_and_of_a_running_one(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny)
    run = compile_run(spec, tmp_path / "runs", BASE + ["trainer.total_steps=6"])
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    # Stopped: the request waits in the inbox and the next attempt serves it before its first step.
    assert main(["rollback", run.name, "--runs-root", str(run.parent), "--to", "1"]) != 0  # no checkpoint <= 1
    assert not (run / "control" / "requests").exists() or not any((run / "control" / "requests").iterdir())
    req = control.submit_request(run, "rollback", to_step=3, lr_scale=0.25)
    assert wait_all(launch_ranks(run, 2, "a1")) == [0, 0], logs_of(run)
    done = json.loads((run / "control" / "done" / f"{req.id}.json").read_text())
    assert done["outcome"]["status"] == "applied" and done["outcome"]["checkpoint"] == 2
    df = hmetrics.load(run).set_index("step")
    assert df.loc[3, "actor/lr"] == pytest.approx(2e-5 * 0.25)
    assert ("control.rollback", 6) in _kinds(run)

    # Running: asked between steps, applied at the next boundary.
    running = compile_run(spec, tmp_path / "runs", BASE + ["trainer.total_steps=12"])
    procs = launch_ranks(running, 2, "a0")
    wait_for_commit(running, 4, procs)
    req = control.submit_request(running, "rollback", to_step=None, lr_scale=None)
    assert wait_all(procs) == [0, 0], logs_of(running)
    done = json.loads((running / "control" / "done" / f"{req.id}.json").read_text())
    assert done["outcome"]["status"] == "applied" and done["outcome"]["checkpoint"] >= 4
    assert list(hmetrics.load(running)["step"]) == list(range(1, 13))
    assert any(kind == "control.rollback" for kind, _ in _kinds(running))


@pytest.mark.slow
def test_set_grad_clip_tightens_both_clips_and_is_kept_in_checkpoints(tmp_path, random_tiny):
    spec = write_spec(tmp_path / "exp.toml", random_tiny, extra=_rule(
        "grad_norm_clip", "actor/grad_norm", "set_grad_clip", grad_clip=0.001, max_count=1))
    run = compile_run(spec, tmp_path / "runs", BASE + ["trainer.total_steps=4"])
    assert wait_all(launch_ranks(run, 2, "a0")) == [0, 0], logs_of(run)
    (event,) = [e for e in events.read_events(run) if e["kind"] == "watchdog.set_grad_clip"]
    assert event["step"] == 1 and event["grad_clip"] == 0.001
    assert "0.001 (actor), 0.001 (critic)" in event["message"]
    state = _watchdog_state(run, 4)
    assert state["grad_clip"] == 0.001 and state["fired"] == {"grad_norm_clip": 1}


@pytest.mark.slow
def test_a_rollback_with_no_checkpoint_before_the_anomaly_pauses_with_that_reason(tmp_path, random_tiny):
    from hpcppo.rundir import exitcodes

    spec = write_spec(tmp_path / "exp.toml", random_tiny, extra=KL_SPEC)
    run = compile_run(spec, tmp_path / "runs", BASE + ["checkpoint.save_every=5", "debug.inject.kl_spike_at_step=2"])
    assert wait_all(launch_ranks(run, 2, "a0")) == [exitcodes.PAUSED] * 2, logs_of(run)
    paused = (run / "control" / "PAUSED").read_text()
    assert "kl_rollback" in paused and "no committed checkpoint predates the anomaly; committed: none" in paused
    # It stopped with its state saved, so `hpcppo resume` (a new attempt) can decide what to do next.
    assert (run / "checkpoints" / "step-2" / "COMMITTED").exists()
    assert [(e["kind"], e["rule"]) for e in events.read_events(run)] == [("watchdog.pause", "kl_rollback"),
                                                                         ("watchdog.suppressed", "kl_raise_coef")]
    assert _watchdog_state(run, 2)["lr_scale"] == 1.0  # the rollback that could not happen cut no lr


@pytest.mark.slow
def test_a_requeue_rule_checkpoints_and_exits_for_the_scheduler_and_does_not_fire_again(tmp_path, random_tiny):
    from hpcppo.rundir import exitcodes

    spec = write_spec(tmp_path / "exp.toml", random_tiny, extra=_rule(
        "slow_node_requeue", "perf/tokens_per_s", "requeue", max_count=1))
    run = compile_run(spec, tmp_path / "runs", BASE + ["trainer.total_steps=4", "checkpoint.save_every=0"])
    assert wait_all(launch_ranks(run, 2, "a0")) == [exitcodes.REQUEUE] * 2, logs_of(run)
    assert (run / "checkpoints" / "step-1" / "COMMITTED").exists()
    assert [(e["kind"], e["step"]) for e in events.read_events(run)] == [("watchdog.requeue", 1)]
    # The requeued attempt resumes from step 1; the rule's count is in the checkpoint, so it does not fire again.
    assert wait_all(launch_ranks(run, 2, "a1")) == [0, 0], logs_of(run)
    assert list(hmetrics.load(run)["step"]) == [1, 2, 3, 4]
    assert len(events.read_events(run, kinds=["watchdog.requeue"])) == 1
