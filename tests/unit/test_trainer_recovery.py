"""The trainer's rollback, pause and critic restart, on one process without ranks.

Tiny ``nn.Linear`` models stand in for the actor and critic; the checkpoint manager, lr schedules, KL controller, the
watchdog's decisions and the control inbox are the real ones, and the checkpoints real DCP directories. A step is
played by hand: the "update" moves the weights by a known amount, the row is judged by the trainer's own
:meth:`Trainer.judge` and carried out by :meth:`Trainer.obey` or :meth:`Trainer.at_boundary`.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from hpcppo.algos import AdaptiveKLController
from hpcppo.config.experiment import DataSection, Experiment, ModelSection
from hpcppo.config.watchdog import Rule, WatchdogSection
from hpcppo.distributed.checkpoint import CheckpointManager
from hpcppo.distributed.checkpoint_io import EXTRA_FILE
from hpcppo.rundir import RunPaths, checkpoints, control, events, exitcodes
from hpcppo.train.build import ModelSet
from hpcppo.train.optim import LRSchedule
from hpcppo.train.trainer import Trainer

LR = 1e-3


class Cursor:
    """A stand-in for the data sampler: only its position, which a rollback must leave where it is."""

    def __init__(self) -> None:
        self.pos = 0

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = int(state["pos"])


def make_trainer(tmp_path: Path, rules: list[Rule]) -> Trainer:
    cfg = Experiment(name="unit", model=ModelSection(path="m"), data=DataSection(train_files=["t.parquet"]),
                     watchdog=WatchdogSection(defaults=False, rules=rules))
    torch.manual_seed(0)
    actor, critic = nn.Linear(3, 3), nn.Linear(3, 1)
    actor_optim = torch.optim.AdamW(actor.parameters(), lr=LR)
    critic_optim = torch.optim.AdamW(critic.parameters(), lr=LR)

    def schedule(optim: torch.optim.Optimizer) -> LRSchedule:
        return LRSchedule(optim, base_lr=LR, warmup_steps=0, total_steps=10, schedule="constant", min_lr_ratio=0.0)

    actor_set = ModelSet(actor, actor_optim, schedule(actor_optim))
    critic_set = ModelSet(critic, critic_optim, schedule(critic_optim))
    c = SimpleNamespace(
        cfg=cfg, plan=SimpleNamespace(world_size=1, train_dp_size=1, placement="colocated"),
        env=SimpleNamespace(rank=0), run_dir=tmp_path,
        actor=actor_set, critic=critic_set, trained=lambda: {"actor": actor_set, "critic": critic_set},
        critic_set=lambda: critic_set,
        kl_ctrl=AdaptiveKLController(0.01, target_kl=0.1, horizon=100), sampler=Cursor(),
        ckpt=CheckpointManager(RunPaths(tmp_path).checkpoints, keep_last=10), metrics=None, attempt=0,
        preempt=SimpleNamespace(local=False),
        engine=SimpleNamespace(), sampling=None,  # the rollout source is built, never asked: these tests run no rollout
        groups=SimpleNamespace(dp_rank=0, dp_size=1),
    )
    return Trainer(c)  # type: ignore[arg-type]


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def play_step(t: Trainer, row: dict[str, float], *, save: bool = False) -> Any:
    """One step by hand: weights and optimizer move, the KL coefficient drifts, the data cursor advances."""
    c = t.c
    t.state = t.state.next_step()
    for model, optim in ((c.actor.model, c.actor.optim), (c.critic.model, c.critic.optim)):
        model(torch.ones(2, 3)).sum().backward()
        optim.step()
        optim.zero_grad()
    t.state = t.state.actor_stepped().with_kl_coef(t.state.kl_coef * 1.1)
    c.sampler.pos += 4
    decision = t.judge(row)
    if save:
        t.recovery.save(t.state)
    return decision


def kinds(run_dir: Path) -> list[str]:
    return [e["kind"] for e in events.read_events(run_dir)]


def test_a_rule_rolls_back_models_schedules_and_kl_coefficient_and_keeps_the_cursor(tmp_path: Path) -> None:
    rule = Rule(name="kl_rollback", metric="kl/actor_ref", condition="gt", threshold=0.05, action="rollback",
                lr_scale=0.5)
    t = make_trainer(tmp_path, [rule])
    play_step(t, {"kl/actor_ref": 0.01})
    play_step(t, {"kl/actor_ref": 0.02}, save=True)
    at_2 = (weights(t.c.actor.model), weights(t.c.critic.model), t.state.kl_coef, t.state.actor_version)
    assert t.obey(play_step(t, {"kl/actor_ref": 0.01})) is None  # step 3: healthy, not saved
    decision = play_step(t, {"kl/actor_ref": 0.3})  # step 4: the spike
    assert [a.kind for a in decision.actions] == ["rollback"]
    assert t.obey(decision) is None  # the run goes on, from step 2

    s = t.state
    assert (s.step, s.branch, s.lr_scale) == (2, 1, 0.5)
    assert s.kl_coef == at_2[2] and s.actor_version > at_2[3]  # the engine must take the restored weights
    assert all(torch.equal(weights(t.c.actor.model)[k], v) for k, v in at_2[0].items())
    assert all(torch.equal(weights(t.c.critic.model)[k], v) for k, v in at_2[1].items())
    assert [r["step"] for r in s.history] == [1.0, 2.0]  # the abandoned branch's rows are forgotten
    assert t.c.sampler.pos == 16  # the batches of steps 3 and 4 are skipped, not replayed
    assert t.c.actor.lr.lr == pytest.approx(LR * 0.5) and t.c.critic.lr.lr == pytest.approx(LR * 0.5)
    assert t.c.ckpt.list_committed() == [2]
    # The checkpoint was saved again with the new branch: a crash from here resumes it, not the abandoned one.
    resumed = make_trainer(tmp_path, [rule])
    resumed.state = resumed.recovery.resume(resumed.state)
    assert (resumed.state.step, resumed.state.branch, resumed.state.lr_scale) == (2, 1, 0.5)
    assert resumed.state.watchdog.fired == {"kl_rollback": 1}
    assert events.watchdog_kind("rollback") in kinds(tmp_path)


def test_a_rollback_with_no_checkpoint_before_the_anomaly_pauses_and_cuts_no_lr(tmp_path: Path) -> None:
    rules = [Rule(name="kl_rollback", metric="kl/actor_ref", condition="gt", threshold=0.05, action="rollback"),
             Rule(name="kl_raise", metric="kl/actor_ref", condition="gt", threshold=0.05, action="raise_kl_coef")]
    t = make_trainer(tmp_path, rules)
    t.obey(play_step(t, {"kl/actor_ref": 0.01}))
    t.recovery.save(t.state)  # step 1, healthy
    t.obey(play_step(t, {"kl/actor_ref": 0.3}))  # the anomaly starts at step 2
    t.recovery.save(t.state)  # step 2's checkpoint: inside the anomaly; the rollback went to 1
    assert t.state.step == 1 and t.c.ckpt.list_committed() == [1]
    t.c.ckpt.abandon_after(0)  # now nothing predates the anomaly that comes next
    decision = play_step(t, {"kl/actor_ref": 0.3})
    assert [a.kind for a in decision.actions] == ["rollback", "raise_kl_coef"]
    coef, scale = t.state.kl_coef, t.state.lr_scale
    assert t.obey(decision) == exitcodes.PAUSED
    # No rollback happened, so no lr cut either; the raise was superseded by the pause.
    assert t.state.lr_scale == pytest.approx(scale * 2) and t.state.kl_coef == coef
    assert control.paused_reason(tmp_path).startswith("step 2: watchdog rule kl_rollback")
    assert t.c.ckpt.list_committed() == [2]  # the pause checkpoints where it stopped
    assert kinds(tmp_path)[-2:] == [events.watchdog_kind("pause"), events.watchdog_kind(events.SUPPRESSED)]


def test_a_pause_rule_checkpoints_and_stops_with_its_reason(tmp_path: Path) -> None:
    t = make_trainer(tmp_path, [Rule(name="kl_pause", metric="kl/actor_ref", condition="gt", threshold=0.1,
                                     action="pause", max_count=1)])
    play_step(t, {"kl/actor_ref": 0.01})
    assert t.obey(play_step(t, {"kl/actor_ref": 0.2})) == exitcodes.PAUSED
    assert t.c.ckpt.list_committed() == [2]
    assert control.paused_reason(tmp_path) == "step 2: watchdog rule kl_pause: kl/actor_ref=0.2 > 0.1"


def test_a_critic_restart_restores_the_critic_only(tmp_path: Path) -> None:
    t = make_trainer(tmp_path, [Rule(name="vf_nan", metric="critic/vf_loss", condition="nonfinite",
                                     action="restart_critic")])
    play_step(t, {"critic/vf_loss": 1.0}, save=True)
    critic_at_1 = weights(t.c.critic.model)
    decision = play_step(t, {"critic/vf_loss": math.nan})
    actor_now, state_now = weights(t.c.actor.model), t.state
    assert t.obey(decision) is None
    assert all(torch.equal(weights(t.c.critic.model)[k], v) for k, v in critic_at_1.items())
    assert all(torch.equal(weights(t.c.actor.model)[k], v) for k, v in actor_now.items())  # untouched
    assert (t.state.step, t.state.branch, t.state.kl_coef) == (state_now.step, state_now.branch, state_now.kl_coef)


def test_a_raise_and_a_tighter_clip_change_the_state_the_next_step_uses(tmp_path: Path) -> None:
    t = make_trainer(tmp_path, [
        Rule(name="kl_raise", metric="kl/actor_ref", condition="gt", threshold=0.05, action="raise_kl_coef",
             factor=2.0, min_value=1e-4, max_value=10.0),
        Rule(name="clip", metric="actor/grad_norm", condition="gt", threshold=100.0, action="set_grad_clip",
             grad_clip=0.25),
    ])
    play_step(t, {"kl/actor_ref": 0.01, "actor/grad_norm": 1.0})
    decision = play_step(t, {"kl/actor_ref": 0.3, "actor/grad_norm": 1e3})
    coef = t.state.kl_coef
    assert t.obey(decision) is None
    assert t.state.kl_coef == pytest.approx(2 * coef)
    assert t.update_settings("actor", epochs=1, mini=1, micro=1, grad_clip=1.0).grad_clip == 0.25
    # What the controller starts the next step from, and what a checkpoint saves, is the raised coefficient.
    assert t.recovery.checkpoint_extra(t.state)["kl_ctrl"]["value"] == t.state.kl_coef


def test_a_checkpoint_whose_watchdog_state_kept_the_kl_coef_resumes(tmp_path: Path, monkeypatch: Any) -> None:
    # Checkpoints written before the training state alone held the coefficient: the watchdog's state in extra.pt
    # kept a copy ("kl_coef", set on a raise), the kl_ctrl entry the value. Written here through the real save (DCP,
    # CRC-32 in the commit marker), read by the real resume.
    raise_rule = Rule(name="kl_raise", metric="kl/actor_ref", condition="gt", threshold=0.05, action="raise_kl_coef",
                      factor=2.0, min_value=1e-4, max_value=10.0)
    t = make_trainer(tmp_path, [raise_rule])
    play_step(t, {"kl/actor_ref": 0.01})
    assert t.obey(play_step(t, {"kl/actor_ref": 0.3})) is None  # raised at step 2
    new_format = t.recovery.checkpoint_extra

    def old_format(state: Any) -> dict[str, Any]:
        extra = new_format(state)
        extra["watchdog"]["state"] = extra["watchdog"]["state"] | {"kl_coef": state.kl_coef}
        return extra

    monkeypatch.setattr(t.recovery, "checkpoint_extra", old_format)
    t.recovery.save(t.state)
    saved = torch.load(checkpoints.step_dir(RunPaths(tmp_path).checkpoints, 2) / EXTRA_FILE, weights_only=True)
    assert saved["watchdog"]["state"]["kl_coef"] == t.state.kl_coef == saved["kl_ctrl"]["value"]
    resumed = make_trainer(tmp_path, [raise_rule])
    resumed.state = resumed.recovery.resume(resumed.state)
    assert (resumed.state.step, resumed.state.kl_coef) == (2, t.state.kl_coef)
    assert resumed.state.watchdog == t.state.watchdog and resumed.state.watchdog.fired == {"kl_raise": 1}


def test_a_pause_request_stops_at_the_boundary_and_is_served_once(tmp_path: Path) -> None:
    t = make_trainer(tmp_path, [])
    play_step(t, {})
    control.request_pause(tmp_path, "look at the samples")
    assert t.at_boundary() == exitcodes.PAUSED
    assert not control.pause_requested(tmp_path)
    assert control.paused_reason(tmp_path) == "step 1: look at the samples"
    assert t.c.ckpt.list_committed() == [1]


def test_a_rollback_request_is_applied_and_acknowledged(tmp_path: Path) -> None:
    t = make_trainer(tmp_path, [])
    play_step(t, {}, save=True)
    play_step(t, {}, save=True)
    play_step(t, {})
    request = control.submit_request(tmp_path, "rollback", to_step=1, lr_scale=0.25)
    assert t.at_boundary() is None
    assert (t.state.step, t.state.branch, t.state.lr_scale) == (1, 1, 0.25)
    assert control.done(tmp_path, request.id)["outcome"] == {"status": "applied", "checkpoint": 1, "step": 1}
    refused = control.submit_request(tmp_path, "rollback", to_step=0)
    assert t.at_boundary() is None and t.state.step == 1
    assert control.done(tmp_path, refused.id)["outcome"]["status"] == "rejected"


def test_the_rule_that_paused_is_re_armed_when_the_run_is_resumed(tmp_path: Path) -> None:
    kl_pause = Rule(name="kl_pause", metric="kl/actor_ref", condition="gt", threshold=0.1, action="pause",
                    max_count=1, cooldown_steps=0)
    t = make_trainer(tmp_path, [kl_pause])
    assert t.obey(play_step(t, {"kl/actor_ref": 0.2})) == exitcodes.PAUSED
    control.clear_pause(tmp_path)  # what `hpcppo resume` does
    again = make_trainer(tmp_path, [kl_pause])
    again.state = again.recovery.resume(again.state)
    assert again.state.watchdog.fired == {"kl_pause": 0} and again.state.watchdog.paused_by is None
    assert events.watchdog_kind(events.REARMED) in kinds(tmp_path)
    # A second excursion pauses the run again instead of passing unwatched (max_count = 1).
    assert again.obey(play_step(again, {"kl/actor_ref": 0.3})) == exitcodes.PAUSED
