"""Split placement on the login-node side (issue 35, docs/placement.md): the roles of a job's ranks, the environment
each task gets, the compiler's arithmetic and refusals, the settings that do nothing."""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path

import pytest

from hpcppo import jobenv
from hpcppo.compiler import compile_config
from hpcppo.errors import ConfigError, ResolveError, SettingWarning
from hpcppo.placement import Role, layout, placement_of, role_of, task_env

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"
ASYNC = REPO / "examples" / "arith-tiny-async.toml"
GSM8K = REPO / "examples" / "gsm8k-qwen2.5-7b.toml"
SPLIT = ['rollout.placement="split"']
SPLIT1 = SPLIT + ["rollout.tensor_parallel_size=1"]  # a rollout rank's engine on its own GPU
NO_VAL = ["trainer.test_freq=0", "trainer.val_before_train=false"]


def _compile(spec: Path, site: str, overrides: list[str]):
    return compile_config(spec, site, overrides, check_paths=False)


# ---------------------------------------------------------------------------------------------------- the layout

def test_rollout_ranks_per_node_are_the_last_local_ranks_of_every_node():
    p = layout("split", 2, 4, rollout_ranks_per_node=1)
    assert p.trainer_ranks == (0, 1, 2, 4, 5, 6) and p.rollout_ranks == (3, 7)
    assert p.trainers_per_node == (3, 3) and p.rollouts_per_node == (1, 1) and p.world_size == 8
    assert (p.trainer_nodes, p.trainer_local_size) == (2, 3)
    assert [role_of(p, r) for r in (0, 3, 4, 7)] == [Role("trainer", 0), Role("rollout", 0), Role("trainer", 3),
                                                      Role("rollout", 1)]


def test_rollout_nodes_are_the_last_nodes():
    p = layout("split", 3, 2, rollout_nodes=1)
    assert p.trainer_ranks == (0, 1, 2, 3) and p.rollout_ranks == (4, 5)
    assert p.trainers_per_node == (2, 2, 0) and (p.trainer_nodes, p.trainer_local_size) == (2, 2)
    assert p.describe() == "split: 4 trainer ranks, 2 rollout ranks (node 2 generates, nodes 0-1 train)"


def test_colocated_every_rank_trains():
    p = layout("colocated", 2, 2)
    assert p.trainer_ranks == (0, 1, 2, 3) and p.rollout_ranks == () and not p.split
    assert role_of(p, 3) == Role("trainer", 3)


@pytest.mark.parametrize("kind, nodes, per_node, rpn, whole, says", [
    ("split", 1, 2, 0, 0, "exactly one of resources.rollout_ranks_per_node"),
    ("split", 2, 2, 1, 1, "both are set"),
    ("split", 1, 2, 2, 0, "leaves no trainer rank on a node of 2 ranks; allowed: 1 to 1"),
    ("split", 2, 1, 1, 0, "a node of 1 rank cannot hold a trainer and a rollout rank"),
    ("split", 2, 4, 0, 2, "leaves no trainer node in a job of 2 nodes; allowed: 1 to 1"),
    ("split", 1, 4, 0, 1, "needs at least 2 nodes"),
    ("colocated", 1, 2, 1, 0, "resources.rollout_ranks_per_node=1 sets rollout ranks apart"),
    ("colocated", 2, 2, 0, 1, "resources.rollout_nodes=1 sets rollout ranks apart"),
])
def test_layouts_that_leave_a_role_empty_are_refused(kind, nodes, per_node, rpn, whole, says):
    with pytest.raises(ResolveError, match="resources.rollout") as err:
        layout(kind, nodes, per_node, rollout_ranks_per_node=rpn, rollout_nodes=whole)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_role_of_a_rank_outside_the_job():
    with pytest.raises(ConfigError, match="rank 4 is outside the job's 4 ranks"):
        role_of(layout("split", 2, 2, rollout_nodes=1), 4)


# ------------------------------------------------------------------------------------------ each task's environment

SRUN = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NNODES": "2",
        "MASTER_ADDR": "node01", "MASTER_PORT": "27345", "PATH": "/bin"}


def test_a_trainer_gets_the_trainers_world():
    p = layout("split", 2, 4, rollout_ranks_per_node=1)  # trainers 0 1 2 | 4 5 6, rollout 3 | 7
    env = task_env(p, SRUN)
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")} == {
        "RANK": "4", "WORLD_SIZE": "6", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "1"}
    assert env["HPCPPO_ROLE"] == "trainer" and env["HPCPPO_GLOBAL_RANK"] == "5" and env["PATH"] == "/bin"
    assert (env["HPCPPO_BRIDGE_ADDR"], env["HPCPPO_BRIDGE_PORT"], env["HPCPPO_BRIDGE_SIZE"]) == (
        "node01", str(jobenv.bridge_port(27345)), "3")
    assert "HPCPPO_ROLLOUT_INDEX" not in env and "RANK" not in SRUN  # a new mapping: the input is untouched


def test_the_trainer_world_is_what_detect_env_reads():
    from hpcppo.distributed.env import detect_env

    p = layout("split", 2, 4, rollout_ranks_per_node=1)
    seen = [detect_env(task_env(p, SRUN | {"SLURM_PROCID": str(r), "SLURM_LOCALID": str(r % 4),
                                           "SLURM_NODEID": str(r // 4)}), device_type="cpu")
            for r in p.trainer_ranks]
    assert [e.rank for e in seen] == list(range(6)) and {e.world_size for e in seen} == {6}
    assert [(e.node_rank, e.local_rank) for e in seen] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert {(e.num_nodes, e.local_world_size, e.master_port) for e in seen} == {(2, 3, 27345)}


def test_a_rollout_rank_gets_its_index_and_the_bridge():
    p = layout("split", 2, 4, rollout_ranks_per_node=1)
    env = task_env(p, SRUN | {"SLURM_PROCID": "7", "SLURM_LOCALID": "3"})
    assert env["HPCPPO_ROLE"] == "rollout" and env["HPCPPO_ROLLOUT_INDEX"] == "1" and env["HPCPPO_ROLLOUT_SIZE"] == "2"
    assert env["HPCPPO_BRIDGE_SIZE"] == "3" and "RANK" not in env


def test_task_env_is_applied_once_and_not_at_all_colocated():
    p = layout("split", 1, 2, rollout_ranks_per_node=1)
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    once = task_env(p, torchrun)
    assert once["WORLD_SIZE"] == "1" and task_env(p, once) == once
    assert task_env(layout("colocated", 1, 2), torchrun) == torchrun


def test_the_bridge_port_the_script_exports_wins_and_a_wrong_world_is_refused():
    p = layout("split", 1, 2, rollout_ranks_per_node=1)
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29500", "HPCPPO_BRIDGE_PORT": "23456"}
    assert task_env(p, env)["HPCPPO_BRIDGE_PORT"] == "23456" and task_env(p, env)["HPCPPO_BRIDGE_ADDR"] == "127.0.0.1"
    with pytest.raises(ConfigError, match="WORLD_SIZE: the job has 3 tasks but the run was planned for 2"):
        task_env(p, env | {"WORLD_SIZE": "3"})
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        task_env(layout("split", 2, 1, rollout_nodes=1), {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})


def test_the_scripts_bridge_port_is_jobenvs():
    """The batch script logs and exports the port (templates/partials/rendezvous.j2); task_env derives the same."""
    c = _compile(ASYNC, "local-slurm", [])
    from hpcppo.launch import render

    text = render.render(c.site, c.experiment, c.plan, Path("/runs/x"), python="python3")
    line = next(s for s in text.splitlines() if s.startswith("HPCPPO_BRIDGE_PORT="))
    for job_id in ("1", "7499", "7500", "12345", "29999"):
        master = jobenv.port_from_job_id(job_id)
        out = subprocess.run(["bash", "-c", f"MASTER_PORT={master}; {line}; echo $HPCPPO_BRIDGE_PORT"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        assert int(out) == jobenv.bridge_port(master) != master
    assert jobenv.bridge_port(jobenv.port_from_job_id("100")) != jobenv.port_from_job_id("101")


# ---------------------------------------------------------------------------------------------------- the compiler

def test_the_async_example_compiles_to_one_trainer_and_one_rollout_rank():
    c = _compile(ASYNC, "local", [])
    p, plan = placement_of(c), c.plan
    assert (plan.placement, plan.world_size, plan.train_dp_size, plan.rollout_ranks, plan.dp_size) == (
        "split", 2, 1, 1, 1)
    assert p.trainer_ranks == (0,) and p.rollout_ranks == (1,) and c.experiment.rollout.max_staleness == 1
    assert plan.samples_per_rank == 128 and plan.actor_mini_batch_per_rank == 64 and plan.mesh_shape == [1]
    colocated = _compile(ARITH, "local", [])
    assert (colocated.plan.placement, colocated.plan.train_dp_size, colocated.plan.rollout_ranks) == ("colocated", 2, 0)


def test_trainers_shard_over_their_own_nodes():
    c = _compile(GSM8K, "h100-cluster", SPLIT1 + ["resources.rollout_nodes=1", "resources.nodes=3"])
    assert c.plan.train_dp_size == 16 and c.plan.hsdp and c.plan.mesh_shape == [2, 8]
    # 16 trainer shares of 64 prompts dealt to 8 rollout ranks: 2 each
    assert c.plan.dp_size == 8 and c.plan.prompts_per_rank == 128
    c = _compile(GSM8K, "h100-cluster", SPLIT1 + ["resources.rollout_nodes=1"])
    assert c.plan.train_dp_size == 8 and not c.plan.hsdp and c.plan.mesh_shape == [8]
    c = _compile(GSM8K, "h100-cluster", SPLIT1 + ["resources.rollout_ranks_per_node=4"])
    assert c.plan.train_dp_size == 8 and c.plan.mesh_shape == [2, 4] and c.plan.prompts_per_rank == 128
    c = _compile(GSM8K, "h100-cluster", SPLIT1 + ["resources.rollout_ranks_per_node=6"])
    assert c.plan.train_dp_size == 4 and c.plan.dp_size == 12 and c.plan.prompts_per_rank == 256  # 4 shares, 12 ranks


def test_tensor_parallel_rollout_engines_are_groups_of_rollout_ranks():
    # the example's TP 2 with a rollout node: 8 rollout ranks form 4 engines; 8 trainer shares of 128 prompts dealt
    # round robin over the 4 engines: 2 each
    c = _compile(GSM8K, "h100-cluster", SPLIT + NO_VAL + ["resources.rollout_nodes=1"])
    assert (c.plan.tensor_parallel_size, c.plan.rollout_ranks, c.plan.dp_size, c.plan.train_dp_size) == (2, 8, 4, 8)
    assert c.plan.prompts_per_rank == 256
    c = _compile(GSM8K, "h100-cluster", SPLIT + NO_VAL + ["resources.rollout_ranks_per_node=4"])  # 2 engines/node
    assert (c.plan.rollout_ranks, c.plan.dp_size, c.plan.train_dp_size, c.plan.prompts_per_rank) == (8, 4, 8, 256)
    # validating too: the rollout engines validate (the trainer ranks hold none), so any tensor-parallel size does
    c = _compile(GSM8K, "h100-cluster", SPLIT + ["resources.rollout_nodes=1"])
    assert c.experiment.trainer.test_freq == 5 and c.plan.tensor_parallel_size == 2 and c.plan.dp_size == 4


@pytest.mark.parametrize("overrides, says", [
    (SPLIT + ["resources.rollout_ranks_per_node=3"],
     "rollout.tensor_parallel_size=2 does not divide resources.rollout_ranks_per_node=3"),
    # one share of the step's prompts per trainer rank: 1024 prompts over 10 trainer ranks do not split
    (SPLIT1 + ["resources.rollout_ranks_per_node=3"],
     "trainer.train_batch_size=1024 prompts cannot be split over the 10 trainer ranks"),
    # the mini-batch is split over the trainer ranks only: 1280 samples over 16 - 4 = 12 of them do not split
    (SPLIT1 + ["resources.rollout_ranks_per_node=2", "trainer.train_batch_size=768"],
     "actor.ppo_mini_batch_size=256 x rollout.n=5 = 1280 samples is not divisible by data-parallel size 12"),
    (["resources.rollout_nodes=1"], "only rollout.placement = \"split\" does"),
    (SPLIT, "needs exactly one of"),
])
def test_split_arithmetic_is_checked(overrides, says):
    with pytest.raises(ResolveError) as err:
        _compile(GSM8K, "h100-cluster", overrides)
    assert says in str(err.value), str(err.value)


def test_settings_that_do_nothing_are_named():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _compile(ARITH, "local", ["rollout.max_staleness=2"])
        _compile(ARITH, "local", [])
        _compile(ASYNC, "local", [])
    said = [str(w.message) for w in seen if issubclass(w.category, SettingWarning)]
    assert said == ["rollout.max_staleness: only rollout.placement = \"split\" has rollout ranks that generate ahead "
                    "of the trainers; colocated runs are on-policy"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _compile(GSM8K, "h100-cluster", SPLIT1 + ["resources.rollout_nodes=1"])  # the spec sets free_cache_engine
    assert any("rollout ranks never sleep" in str(w.message) for w in seen)
