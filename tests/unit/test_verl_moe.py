"""``hpcppo import-verl`` and verl's mixture-of-experts keys (issue 37 item 7, :mod:`hpcppo.verl.names.moe`): kept
where their value is what hpcppo does (no expert parallelism, no routing replay, a router that trains), refused in
one line each otherwise, naming expert parallelism as out of scope."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.verl import names as verl

HEAD = "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=/m data.train_files=/d.parquet \\\n"
# verl's defaults (or the values a Qwen3-MoE FSDP script of verl's examples sets), each what hpcppo does.
KEPT = [
    "actor_rollout_ref.rollout.expert_parallel_size=1",
    "actor_rollout_ref.actor.router_replay.mode=disabled",
    "actor_rollout_ref.ref.router_replay.mode=disabled",
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size=1",
    "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=null",
    "critic.megatron.expert_tensor_parallel_size=1",
    "+actor_rollout_ref.model.override_config.moe_config.freeze_moe_router=False",
    "actor_rollout_ref.rollout.enable_rollout_routing_replay=False",
]
# (setting, the reason its line gives)
REFUSED = [
    ("actor_rollout_ref.rollout.expert_parallel_size=8", "expert parallelism is not in hpcppo's scope"),
    ("actor_rollout_ref.actor.megatron.expert_model_parallel_size=8", "expert parallelism is not in hpcppo's scope"),
    ("actor_rollout_ref.ref.megatron.expert_tensor_parallel_size=2", "expert parallelism is not in hpcppo's scope"),
    ("actor_rollout_ref.actor.router_replay.mode=R3", "MoE routing replay"),
    ("actor_rollout_ref.rollout.enable_rollout_routing_replay=True", "MoE routing replay"),
    ("+actor_rollout_ref.model.override_config.moe_config.freeze_moe_router=True", "trains the router"),
]


def import_lines(tmp_path: Path, settings: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    script = tmp_path / "run.sh"
    script.write_text(HEAD + " \\\n".join(settings) + "\n")
    main(["import-verl", str(script), "-o", str(tmp_path / "exp.toml")])
    return capsys.readouterr().err.splitlines()


def line_of(lines: list[str], setting: str) -> str:
    found = [ln for ln in lines if f" {setting}: " in ln]
    assert len(found) == 1, (setting, lines)
    return found[0]


def test_moe_keys_at_what_hpcppo_does_are_kept(tmp_path, capsys):
    lines = import_lines(tmp_path, KEPT, capsys)
    for setting in KEPT:
        assert line_of(lines, setting).startswith("hpcppo: not translated [ignored] "), setting
    assert (tmp_path / "exp.toml").exists()


def test_expert_parallelism_routing_replay_and_a_frozen_router_are_refused_in_one_line_each(tmp_path, capsys):
    lines = import_lines(tmp_path, [s for s, _ in REFUSED], capsys)
    for setting, reason in REFUSED:
        line = line_of(lines, setting)
        assert line.startswith("hpcppo: not translated [unsupported] ") and reason in line, line


def test_every_moe_key_of_verls_configs_has_its_own_row_not_the_megatron_catch_all():
    for key in ("actor_rollout_ref.actor.megatron.expert_model_parallel_size",
                "actor_rollout_ref.ref.megatron.expert_model_parallel_size",
                "critic.megatron.expert_model_parallel_size", "reward_model.megatron.expert_tensor_parallel_size",
                "critic.model.override_config.moe_config.freeze_moe_router"):
        entry = verl.lookup(key)
        assert entry is not None and not entry.prefix and entry.verl == key, key
