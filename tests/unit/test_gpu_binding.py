"""Which GPU a rank computes on when Slurm binds GPUs to tasks, and the srun line that keeps them unbound.

hpcppo runs one rank per GPU. A task that sees all of its node's GPUs takes ``cuda:<local rank>``; a site whose
Slurm binds one GPU per task leaves each task a single visible device, where ``cuda:<local rank>`` does not exist:
the rank takes ``cuda:0``, and vLLM (which selects ``cuda:<LOCAL_RANK>``) is given the same index. The job script
leaves the binding to the site unless ``site.slurm.gpu_bind`` names one. CUDA cannot run here: the process group's
device is checked with recording stand-ins for ``torch.cuda.set_device`` and ``init_process_group``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpcppo.compiler import compile_config
from hpcppo.distributed import env as dist_env
from hpcppo.distributed.env import cuda_device_index, detect_env, export_launcher_vars, launcher_vars
from hpcppo.errors import ConfigError, HpcppoError
from hpcppo.launch import render

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "examples" / "gsm8k-qwen2.5-7b.toml"
ARITH = REPO / "examples" / "arith-tiny.toml"
RUN_DIR = Path("/runs/example-20260101-000000-abcd")


@pytest.mark.parametrize("local_rank,local_world,visible,expected", [
    (3, 4, None, 3),            # nothing hidden: the node's GPUs
    (3, 4, "0,1,2,3", 3),       # all of them listed
    (1, 2, "4,5,6,7", 1),       # a node shared by jobs: this job's GPUs, listed in full
    (3, 4, "3", 0),             # one GPU bound per task (cgroup-less numbering)
    (3, 4, "0", 0),             # one GPU bound per task, renumbered by ConstrainDevices
    (2, 4, "GPU-5f1c,", 0),     # a UUID and a trailing comma
    (0, 1, "2", 0),             # a single-rank job given GPU 2
])
def test_cuda_device_index(local_rank, local_world, visible, expected):
    assert cuda_device_index(local_rank, local_world, visible) == expected


@pytest.mark.parametrize("local_rank,local_world,visible", [(3, 4, "0,1"), (1, 2, ""), (2, 4, "0,1,2")])
def test_a_task_that_sees_neither_all_nor_one_gpu_is_refused_with_the_variable_named(local_rank, local_world, visible):
    with pytest.raises(ConfigError, match=r"CUDA_VISIBLE_DEVICES.*this task sees \d GPU\(s\).*either all of the "
                                          r"job's GPUs on the node or exactly one \(site.slurm.gpu_bind sets srun's "
                                          r"--gpu-bind\)"):
        cuda_device_index(local_rank, local_world, visible)


SLURM = {"SLURM_NTASKS": "8", "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_ID": "4711",
         "MASTER_ADDR": "n1", "MASTER_PORT": "19123", "SLURM_PROCID": "6", "SLURM_LOCALID": "2", "SLURM_NODEID": "1"}


def test_slurm_task_bound_to_one_gpu_computes_on_cuda0_and_tells_vllm_so():
    env = detect_env(SLURM | {"CUDA_VISIBLE_DEVICES": "2"}, device_type="cuda")
    assert (env.rank, env.local_rank, env.local_world_size, env.device_index) == (6, 2, 4, 0)
    assert launcher_vars(env)["LOCAL_RANK"] == "0"
    unbound = detect_env(SLURM | {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, device_type="cuda")
    assert unbound.device_index == 2 and launcher_vars(unbound)["LOCAL_RANK"] == "2"
    assert detect_env(SLURM, device_type="cuda").device_index == 2
    # CPU ranks do not look at GPUs at all (the dev cluster's fake GPUs set CUDA_VISIBLE_DEVICES too).
    assert detect_env(SLURM | {"CUDA_VISIBLE_DEVICES": "0,1"}, device_type="cpu").device_index == 2


def test_export_launcher_vars_replaces_the_launchers_local_rank_by_the_device_index():
    bound = detect_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
                        "CUDA_VISIBLE_DEVICES": "3"}, device_type="cuda")
    environ = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}
    export_launcher_vars(bound, environ)
    assert environ["LOCAL_RANK"] == "0" and environ["RANK"] == "3"
    with pytest.raises(ConfigError, match="the environment says LOCAL_RANK=1 but this process is LOCAL_RANK=0"):
        export_launcher_vars(bound, {"LOCAL_RANK": "1"})


def test_the_process_group_binds_the_derived_device(monkeypatch):
    """Recording stand-ins for torch.cuda.set_device and init_process_group: a bound task selects cuda:0."""
    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(dist_env.dist, "init_process_group",
                        lambda **kwargs: calls.append(("init_process_group", kwargs["device_id"])))
    monkeypatch.setattr(dist_env.dist, "is_initialized", lambda: False)
    env = detect_env(SLURM | {"CUDA_VISIBLE_DEVICES": "2"}, device_type="cuda")
    dist_env.init_distributed(env)
    assert calls == [("set_device", 0), ("init_process_group", torch.device("cuda", 0))]


def _srun_block(spec: Path, site: str, overrides: list[str]) -> list[str]:
    c = compile_config(spec, site, overrides, check_paths=False)
    text = render.render(c.site, c.experiment, c.plan, RUN_DIR, python="python3")
    start = text.index("\nsrun \\\n")
    return text[start:text.index("\nrc=$?", start)].split("\n")[2:]


# The dev cluster's GPU-shaped site runs 16 ranks: micro-batches of 1 fit the example's mini-batches.
MICRO_16 = ["actor.ppo_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1"]


@pytest.mark.parametrize("spec,site,base", [(GSM8K, "a100-cluster", []), (GSM8K, "h100-cluster", []),
                                            (ARITH, "local-slurm-gpu", MICRO_16)])
def test_gpu_jobs_leave_the_sites_binding_unless_the_site_sets_one(spec, site, base):
    assert not any("--gpu-bind" in line for line in _srun_block(spec, site, base))
    assert "  --gpu-bind=none \\" in _srun_block(spec, site, [*base, "site.slurm.gpu_bind=none"])
    assert "  --gpu-bind=single:1 \\" in _srun_block(spec, site, [*base, "site.slurm.gpu_bind=single:1"])


def test_cpu_jobs_render_no_gpu_bind():
    assert not any("--gpu-bind" in line for line in _srun_block(ARITH, "local-slurm", ["site.slurm.gpu_bind=none"]))


def test_a_gpu_bind_that_is_not_one_srun_word_is_refused():
    with pytest.raises(HpcppoError, match="gpu_bind"):
        compile_config(GSM8K, "a100-cluster", ["site.slurm.gpu_bind=none --exclusive"], check_paths=False)
