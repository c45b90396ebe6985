"""examples/arith-tool.toml end to end (issue 34, item 7): the tiny tool model, warm-started on calculator calls,
learns with GRPO to multiply 3-digit numbers by calling the calculator through the multi-turn loop, far above the
same spec with the tool disabled; a watchdog rollback works on the run, and a run killed after the rollback and
resumed equals the straight run bit for bit. Three runs share one build of the model: the straight run (with an
injected reward collapse that the reward rule rolls back), the killed-and-resumed copy of it, and the run without
the tool."""

from __future__ import annotations

import pytest

from hpcppo import metrics as hmetrics
from hpcppo.rundir import events

from _harness import REPO, comparable, compile_run, kill_at_commit, launch_ranks, logs_of, wait_all

EXAMPLE = REPO / "examples" / "arith-tool.toml"
STEPS = 16


@pytest.fixture(scope="module")
def tool_tiny(tmp_path_factory):
    """The tool variant of the tiny model and its data, as `hpcppo tools make-model --variant tool` builds them."""
    from hpcppo.tiny import build_tiny_model_and_data

    root = tmp_path_factory.mktemp("tool-tiny")
    return root, build_tiny_model_and_data(root / "model", root / "data", seed=0, variant="tool")


def _actor_weights(run_dir, step):
    from hpcppo.config import load_resolved
    from hpcppo.distributed.checkpoint import CheckpointManager
    from hpcppo.models import build_actor

    actor = build_actor(load_resolved(run_dir / "resolved.toml").experiment.model.path)
    CheckpointManager(run_dir / "checkpoints", keep_last=0, rank=0, world_size=1).load(
        step, models={"actor": actor}, optimizers={}, restore_rng=False)
    return actor.state_dict()


@pytest.mark.slow
def test_the_tool_example_learns_rolls_back_and_resumes_bit_exactly(tmp_path, tool_tiny):
    root, info = tool_tiny
    ws = info["warm_start"]
    # The warm start calls the tool about half the time and copies well: RL has headroom and a signal.
    assert 0.15 <= ws["train_sampled_accuracy"] <= 0.6, ws
    assert ws["task_stage"]["reached_target"], ws
    assert ws["train_sampled_accuracy_without_tool"] == 0.0  # it cannot multiply in its head

    common = [f"model.path={root / 'model'}", f"data.train_files=['{root / 'data' / 'train.parquet'}']",
              f"data.val_files=['{root / 'data' / 'val.parquet'}']", f"trainer.total_steps={STEPS}",
              "trainer.test_freq=0", "trainer.val_before_train=false"]
    with_tool = common + ["checkpoint.save_every=4", "debug.inject.reward_collapse_at_step=11"]
    straight = compile_run(EXAMPLE, tmp_path / "runs", with_tool)
    assert wait_all(launch_ranks(straight, 2, "a0")) == [0, 0], logs_of(straight)
    off = compile_run(EXAMPLE, tmp_path / "runs", common + ["checkpoint.save_every=0", "rollout.multi_turn.enable=false"])
    assert wait_all(launch_ranks(off, 2, "a0")) == [0, 0], logs_of(off)

    df = hmetrics.load(straight).set_index("step")
    assert list(df.index) == list(range(1, STEPS + 1))
    # The watchdog: the injected collapse at step 11 (x0.2, a fall of 80%) rolled back to checkpoint 8.
    (rollback,) = [e for e in events.read_events(straight) if e["kind"] == "watchdog.rollback"]
    assert (rollback["step"], rollback["checkpoint"], rollback["rule"]) == (11, 8, "reward_drop_rollback")
    assert df.loc[8, "actor/lr"] == pytest.approx(2 * df.loc[9, "actor/lr"])

    # It learns to use the tool: far above the same spec without it, calling it more and more.
    reward, reward_off = df["reward/mean"], hmetrics.load(off).set_index("step")["reward/mean"]
    assert reward.tail(5).mean() >= reward_off.tail(5).mean() + 0.3, (reward.tolist(), reward_off.tolist())
    assert reward.tail(5).mean() > reward.head(3).mean() + 0.1, reward.tolist()
    calls = df["rollout/tool_calls_mean"]
    assert calls.tail(5).mean() > calls.head(3).mean() + 0.1, calls.tolist()
    assert (df["rollout/turns_max"] <= 2).all()  # the call, then the answer (max_assistant_turns)

    # Killed right after the first checkpoint past the rollback, and resumed: the same run, bit for bit.
    resumed = compile_run(EXAMPLE, tmp_path / "runs", with_tool)
    kill_at_commit(resumed, 12, launch_ranks(resumed, 2, "a0"))
    assert wait_all(launch_ranks(resumed, 2, "a1")) == [0, 0], logs_of(resumed)
    a, b = comparable(hmetrics.load(straight)), comparable(hmetrics.load(resumed))
    assert list(b.index) == list(range(1, STEPS + 1))
    assert a.equals(b), (a - b).abs().max().sort_values().tail(10)
    wa, wb = _actor_weights(straight, STEPS), _actor_weights(resumed, STEPS)
    assert all((wa[k] == wb[k]).all() for k in wa)
