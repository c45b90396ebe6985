"""detect_env on literal environments of each launcher; meshes' shapes; a real submitit local job of 2 tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcppo.distributed.env import DistEnv, detect_env, expand_tasks_per_node, first_host, port_from_job_id
from hpcppo.distributed.mesh import mesh_shape
from hpcppo.errors import ConfigError, ResolveError


def test_torchrun_variables():
    env = detect_env({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
                      "MASTER_ADDR": "node7", "MASTER_PORT": "29400"}, device_type="cuda")
    assert env == DistEnv(rank=5, local_rank=1, world_size=8, local_world_size=4, node_rank=1, num_nodes=2,
                          master_addr="node7", master_port=29400, device_type="cuda", backend="nccl",
                          source="torchrun")


def test_torchrun_wins_over_slurm_variables():
    # Our sbatch may export RANK etc. inside an srun task; torchrun-style variables are authoritative.
    env = detect_env({"RANK": "0", "WORLD_SIZE": "1", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}, device_type="cpu")
    assert (env.source, env.world_size, env.backend) == ("torchrun", 1, "gloo")


def test_slurm_two_nodes_two_tasks_each():
    base = {"SLURM_NTASKS": "4", "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "4711",
            "MASTER_ADDR": "n1", "MASTER_PORT": "19123"}
    envs = [detect_env(base | {"SLURM_PROCID": str(r), "SLURM_LOCALID": str(r % 2), "SLURM_NODEID": str(r // 2)},
                       device_type="cpu") for r in range(4)]
    assert [(e.rank, e.local_rank, e.node_rank) for e in envs] == [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
    assert {(e.world_size, e.local_world_size, e.num_nodes, e.master_addr, e.master_port, e.source)
            for e in envs} == {(4, 2, 2, "n1", 19123, "slurm")}


def test_slurm_uneven_tasks_and_fallbacks():
    env = detect_env({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
                      "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "3,1", "SLURM_JOB_ID": "12345",
                      "SLURM_JOB_NODELIST": "gpu[003-004]"}, device_type="cpu")
    assert env.local_world_size == 1
    assert env.master_addr == "gpu003"  # no MASTER_ADDR exported: first host of the allocation
    assert env.master_port == port_from_job_id("12345") == 27345  # the same on every task of the job
    env = detect_env({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2",
                      "SLURM_LOCALID": "1", "MASTER_ADDR": "h", "MASTER_PORT": "20000"}, device_type="cpu")
    assert (env.local_world_size, env.node_rank) == (2, 0)


def test_submitit_local_variables():
    environ = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_GLOBALID": "1",
               "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
               "SUBMITIT_LOCAL_JOB_ID": "31337"}
    env = detect_env(environ, device_type="cpu")
    assert (env.rank, env.local_rank, env.world_size, env.num_nodes, env.source) == (1, 1, 2, 1, "submitit-local")
    assert env.master_addr == "127.0.0.1" and env.master_port == port_from_job_id("31337")


def test_single_process_default():
    env = detect_env({}, device_type="cpu")
    assert (env.rank, env.world_size, env.num_nodes, env.is_distributed, env.source) == (0, 1, 1, False, "single")


@pytest.mark.parametrize(("environ", "message"), [
    ({"RANK": "x", "WORLD_SIZE": "2"}, r"RANK: expected an integer, got 'x'"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, r"rank 2 is outside world size 2"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_TASKS_PER_NODE": "two"},
     r"SLURM_TASKS_PER_NODE: cannot parse 'two'"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NNODES": "1", "MASTER_PORT": "70000"},
     r"master port 70000 is not a TCP port"),
    ({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_GLOBALID": "0"}, r"SUBMITIT_LOCAL_NTASKS: required"),
])
def test_malformed_environments_name_the_variable(environ, message):
    with pytest.raises(ConfigError, match=message):
        detect_env(environ, device_type="cpu")


def test_slurm_string_helpers():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("8") == [8]
    assert first_host("n1") == "n1"
    assert first_host("gpu[003-005,9],cpu1") == "gpu003"
    assert first_host("a-b[10,12]") == "a-b10"


def test_mesh_shapes():
    assert mesh_shape(8, 1, hsdp=True) == ((8,), ("shard",))
    assert mesh_shape(8, 2, hsdp=False) == ((8,), ("shard",))
    assert mesh_shape(8, 2, hsdp=True) == ((2, 4), ("replicate", "shard"))
    with pytest.raises(ResolveError, match="world size 6 is not a multiple of 4 nodes"):
        mesh_shape(6, 4, hsdp=True)


def _submitit_task() -> dict:
    import os

    from hpcppo.distributed.env import all_reduce_scalar, broadcast_object, destroy_distributed, detect_env, init_distributed

    env = detect_env(os.environ, device_type="cpu")
    init_distributed(env, timeout_s=60)
    init_distributed(env, timeout_s=60)  # idempotent
    try:
        return {"env": env, "sum": all_reduce_scalar(env.rank + 1, "sum"), "mean": all_reduce_scalar(env.rank, "mean"),
                "token": broadcast_object(f"from-{env.rank}")}
    finally:
        destroy_distributed(sync_timeout_s=60)


def test_submitit_local_executor_two_tasks(tmp_path, monkeypatch):
    """The embedded default launcher, for real: our detection + init inside submitit's local tasks."""
    import submitit
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # the task unpickles this module by name
    executor = submitit.LocalExecutor(folder=tmp_path / "submitit")
    executor.update_parameters(tasks_per_node=2, nodes=1, timeout_min=2)
    job = executor.submit(_submitit_task)
    results = job.results()
    assert [r["env"].rank for r in results] == [0, 1]
    assert {(r["env"].world_size, r["env"].source, r["env"].master_port) for r in results} == {
        (2, "submitit-local", port_from_job_id(str(job.job_id)))}
    assert [r["sum"] for r in results] == [3.0, 3.0]
    assert [r["mean"] for r in results] == [0.5, 0.5]
    assert [r["token"] for r in results] == ["from-0", "from-0"]


def _leave_together(rank: int, world_size: int) -> float:
    import time

    from hpcppo.distributed.env import destroy_distributed

    if rank == 1:
        time.sleep(1.0)  # still busy when rank 0 wants to leave
    start = time.monotonic()
    destroy_distributed(sync_timeout_s=30)
    return time.monotonic() - start


def test_destroy_with_sync_waits_for_the_slow_peer():
    """Rank 0 (the store's host) must not tear down while a peer is still working: it waits in the barrier."""
    from _spawn import run_distributed

    waited = run_distributed(_leave_together, 2)
    assert waited[0] >= 0.8, waited
    assert waited[1] < waited[0], waited
