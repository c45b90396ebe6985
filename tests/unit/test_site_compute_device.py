"""``slurm.compute_device``: a GPU-shaped request with CPU compute (``sites/local-slurm-gpu.toml``).

The job asks Slurm for GPUs exactly as a GPU site does (the directive, 8 ranks per node, the srun line), while
the ranks run on the CPU over gloo. The real-Slurm side is tests/slurm/test_gpu_shaped.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.compiler import compile_config
from hpcppo.config import load_site
from hpcppo.errors import ConfigError, ResolveError
from hpcppo.launch import render
from hpcppo.resources import resource_dir

ARITH = resource_dir("examples") / "arith-tiny.toml"
GSM8K = resource_dir("examples") / "gsm8k-qwen2.5-7b.toml"
MICRO = ["actor.ppo_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1"]  # 16 ranks
RUN_DIR = Path("/runs/example-20260101-000000-abcd")


def _srun_options(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("srun \\")
    return [ln.strip().removesuffix(" \\") for ln in lines[start + 1:] if ln.strip().startswith("--")]


def test_shipped_gpu_shaped_site_is_the_a100_shape_on_cpu():
    site, a100 = load_site("local-slurm-gpu"), load_site("a100-cluster")
    assert (site.device, a100.device, load_site("local-slurm").device) == ("cpu", "cuda", "cpu")
    for key in ("partition", "account", "qos", "constraint", "gpus_per_node", "gpu_request", "exclusive", "requeue"):
        assert getattr(site.slurm, key) == getattr(a100.slurm, key), key
    assert (site.slurm.max_nodes, site.slurm.compute_device, a100.slurm.compute_device) == (2, "cpu", "auto")


def test_cpu_compute_keeps_the_gpu_request_and_the_srun_line():
    c = compile_config(ARITH, "local-slurm-gpu", MICRO, check_paths=False)
    p = c.plan
    assert (p.device, p.backend, p.nodes, p.ranks_per_node, p.world_size, p.gpus_per_node) == ("cpu", "gloo", 2, 8, 16, 8)
    text = render.render(c.site, c.experiment, p, RUN_DIR, python="/venv/bin/python")
    assert "#SBATCH --gpus-per-node=8\n" in text and "#SBATCH --constraint=a100\n" in text
    a100 = compile_config(GSM8K, "a100-cluster", [], check_paths=False)
    assert a100.plan.device == "cuda" and a100.plan.backend == "nccl"
    a100_text = render.render(a100.site, a100.experiment, a100.plan, RUN_DIR, python="/venv/bin/python")
    assert _srun_options(text) == _srun_options(a100_text)
    # The gres form too: the request follows gpus_per_node, not the compute device.
    c = compile_config(ARITH, "local-slurm-gpu", [*MICRO, "site.slurm.gpu_request=gres",
                                                  "site.slurm.gres_name=gpu:a100"], check_paths=False)
    assert "#SBATCH --gres=gpu:a100:8\n" in render.render(c.site, c.experiment, c.plan, RUN_DIR, python="/p")


def test_cpu_compute_refuses_what_vllms_cpu_backend_cannot_do():
    # GSM8K's spec asks for vLLM with sleep mode (free_cache_engine's default): the CPU backend has none
    with pytest.raises(ResolveError, match=r"rollout.free_cache_engine=true: vLLM's CPU backend has no sleep mode .* "
                                           r"site 'local-slurm-gpu' computes on the CPU"):
        compile_config(GSM8K, "local-slurm-gpu", ["resources.time=01:00:00"], check_paths=False)


def test_compute_device_bad_value_is_one_line(tmp_path, capsys):
    site = tmp_path / "s.toml"
    site.write_text('name = "s"\n[slurm]\ngpus_per_node = 8\ncompute_device = "gpu"\n')
    with pytest.raises(ConfigError) as info:
        load_site(site)
    assert str(info.value).startswith(f'{site}: slurm.compute_device: "gpu" is not allowed; allowed values: "auto", "cpu"')
    rc = main(["compile", str(ARITH), "--site", str(site), "--runs-root", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc != 0 and err.count("\n") == 1 and "slurm.compute_device" in err and '"auto", "cpu"' in err, err
