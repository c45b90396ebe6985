"""import-verl with verl's asynchronous recipes (issue 35, docs/verl.md): one-step-off and fully async become split
placement with a staleness bound; what has no counterpart is refused, one report line each."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hpcppo.verl.importer import import_verl, read_yaml, translate

BASE = ("data.train_files=/d/train.parquet actor_rollout_ref.model.path=/m actor_rollout_ref.rollout.name=vllm "
        "actor_rollout_ref.actor.ppo_mini_batch_size=32 data.train_batch_size=256 ")
ONE_STEP_OFF = "python3 -m verl.experimental.one_step_off_policy.main_ppo "
FULLY_ASYNC = "python3 -m verl.experimental.fully_async_policy.fully_async_main "


def _import(tmp_path: Path, line: str):
    out = tmp_path / "exp.toml"
    imp, _ = import_verl("-", out, stdin_text=line + "\n", cwd=tmp_path, force=True)
    return imp, tomllib.loads(out.read_text())


def _report(imp) -> dict[str, str]:
    return {text.partition("=")[0]: f"[{kind}] {why}" for kind, text, why in imp.report}


def test_one_step_off_is_split_with_staleness_one_on_shared_nodes(tmp_path):
    imp, spec = _import(tmp_path, ONE_STEP_OFF + BASE + "actor_rollout_ref.hybrid_engine=False trainer.nnodes=1 "
                        "trainer.n_gpus_per_node=6 rollout.nnodes=1 rollout.n_gpus_per_node=2")
    assert spec["rollout"]["placement"] == "split" and spec["rollout"]["max_staleness"] == 1
    assert spec["resources"] == {"nodes": 1, "gpus_per_node": 8, "rollout_ranks_per_node": 2}
    assert spec["algorithm"]["rollout_correction"]["bypass_mode"] is True  # the recipe's default
    assert spec["trainer"]["train_batch_size"] == 256


def test_fully_async_with_whole_staleness_and_one_update_per_sync(tmp_path):
    imp, spec = _import(tmp_path, FULLY_ASYNC + BASE + "actor_rollout_ref.hybrid_engine=False trainer.nnodes=2 "
                        "trainer.n_gpus_per_node=8 rollout.nnodes=1 rollout.n_gpus_per_node=8 "
                        "async_training.staleness_threshold=2 async_training.trigger_parameter_sync_step=1 "
                        "async_training.partial_rollout=False async_training.require_batches=2 "
                        "rollout.total_rollout_steps=6400")
    assert (spec["rollout"]["placement"], spec["rollout"]["max_staleness"]) == ("split", 2)
    assert spec["resources"] == {"nodes": 3, "gpus_per_node": 8, "rollout_nodes": 1, "hsdp": "off"}  # fsdp_size -1
    # a step is require_batches x ppo_mini_batch_size prompts; verl's data.train_batch_size is not one here
    assert spec["trainer"]["train_batch_size"] == 64 and spec["trainer"]["total_steps"] == 100
    report = _report(imp)
    assert report["data.train_batch_size"].startswith("[ignored] the fully async recipe's trainer updates")
    assert not any(k.startswith("async_training.") and not why.startswith("[ignored]") for k, why in report.items())
    assert "is what hpcppo does" in report["async_training.trigger_parameter_sync_step"]


def test_what_fully_async_has_and_hpcppo_has_not_is_refused_one_line_each(tmp_path):
    # the recipe's example shape (dapo_7b_math_fsdp2_8_8.sh): staleness 0.1, 4 updates per sync, partial rollouts
    imp, spec = _import(tmp_path, FULLY_ASYNC + BASE + "actor_rollout_ref.hybrid_engine=False "
                        "async_training.staleness_threshold=0.1 async_training.trigger_parameter_sync_step=4 "
                        "async_training.compute_prox_log_prob=True")
    report = _report(imp)
    assert "0.1 is a fraction of a sync period's samples" in report["async_training.staleness_threshold"]
    assert report["async_training.trigger_parameter_sync_step"].startswith("[unsupported] hpcppo broadcasts weights "
                                                                          "after every update")
    # not in the input: the recipe's default (true) is what verl ran with
    assert "no interrupted rollouts" in report["async_training.partial_rollout"]
    assert report["async_training.compute_prox_log_prob"].startswith("[unsupported]")
    assert "max_staleness" not in spec["rollout"]
    assert all("\n" not in why for why in report.values())


def test_partial_rollout_does_nothing_on_policy(tmp_path):
    """verl: partial_rollout "only actually takes effect when staleness_threshold>0"; its default is not written."""
    imp, spec = _import(tmp_path, FULLY_ASYNC + BASE + "actor_rollout_ref.hybrid_engine=False "
                        "async_training.staleness_threshold=0 async_training.trigger_parameter_sync_step=1")
    assert spec["rollout"]["max_staleness"] == 0 and "async_training.partial_rollout" not in _report(imp)


def test_pools_that_fit_no_split_are_refused(tmp_path):
    imp, spec = _import(tmp_path, ONE_STEP_OFF + BASE + "actor_rollout_ref.hybrid_engine=False trainer.nnodes=2 "
                        "trainer.n_gpus_per_node=6 rollout.nnodes=1 rollout.n_gpus_per_node=4")
    report = _report(imp)
    assert "fit neither of hpcppo's splits" in report["rollout.nnodes"]
    assert "fit neither of hpcppo's splits" in report["rollout.n_gpus_per_node"]


def test_a_yaml_with_async_keys_is_read_as_the_fully_async_recipe():
    settings, _ = read_yaml("actor_rollout_ref:\n  hybrid_engine: false\n  actor:\n    ppo_mini_batch_size: 16\n"
                         "async_training:\n  staleness_threshold: 1\n  trigger_parameter_sync_step: 1\n"
                         "  partial_rollout: false\n", "c.yaml")
    imp = translate(settings)
    assert imp.values["rollout.placement"] == "split" and imp.values["rollout.max_staleness"] == 1
    assert imp.values["trainer.train_batch_size"] == 16  # require_batches: the recipe's default 1


def test_verls_own_trainer_stays_colocated(tmp_path):
    imp, spec = _import(tmp_path, "python3 -m verl.trainer.main_ppo " + BASE + "rollout.nnodes=2")
    assert "placement" not in spec.get("rollout", {}) and "rollout_nodes" not in spec.get("resources", {})
    assert _report(imp)["rollout.nnodes"].startswith("[ignored] verl reads it only with hybrid_engine=False")


@pytest.mark.parametrize("value", ["True", "true"])
def test_hybrid_engine_true_is_colocated(tmp_path, value):
    _, spec = _import(tmp_path, "python3 -m verl.trainer.main_ppo " + BASE + f"actor_rollout_ref.hybrid_engine={value}")
    assert spec["rollout"]["placement"] == "colocated"
