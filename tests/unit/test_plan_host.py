"""Host memory per node while the models load (issue 21): ``hpcppo plan`` shows it, compile refuses in one line a
site whose ``slurm.mem_per_task`` cannot hold it; the arithmetic follows hpcppo.train.build.load_sharded (each rank
reads its rows of each tensor), with the old path (the whole float32 model on every rank) beside it."""

from __future__ import annotations

import math
from pathlib import Path

from hpcppo.cli import main
from hpcppo.compiler import compile_config
from hpcppo.sizing.catalog import ASSUMPTIONS, GIB, KNOWN_MODELS
from hpcppo.sizing.estimate import estimate, slurm_mem_bytes

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "examples" / "gsm8k-qwen2.5-7b.toml"
LLAMA70 = ["-o", "model.path=meta-llama/Llama-3.1-70B"]


def host(site: str, overrides: list[str]) -> tuple[dict, object]:
    pairs = [o for o in overrides if o != "-o"]
    c = compile_config(GSM8K, site, pairs, check_paths=False, check_memory=False)
    return estimate(c.site, c.experiment, c.plan).host, c


def test_slurm_memory_sizes():
    assert slurm_mem_bytes("") is None
    assert slurm_mem_bytes("200G") == 200 * 2**30
    assert slurm_mem_bytes("512000") == slurm_mem_bytes("512000M") == 512000 * 2**20
    assert slurm_mem_bytes("2T") == 2 * 2**40


def test_gpu_ranks_hold_one_tensors_rows_and_offloaded_shards_only():
    m = KNOWN_MODELS["llama-3.1-70b"]
    process = int(ASSUMPTIONS["rank process host"].value * GIB)
    # actor on the GPU, reference offloaded to the host, a critic on the GPU (GAE): 8 ranks shard each model
    h, c = host("h100-cluster", [*LLAMA70, "-o", "actor.fsdp.param_offload=false", "-o", "reference.offload=true"])
    shard = c.plan.mesh_shape[-1]
    assert c.plan.needs_reference and shard == 8 and h["ranks_per_node"] == 8
    held = math.ceil(m.params * 4 / shard)  # the reference's shards: the only ones kept on the host
    rows = math.ceil(m.vocab * m.hidden * 4 / shard)  # the embedding's (= LM head's) rows of this rank
    assert h["shards_on_host_bytes"] == held and h["largest_slice_bytes"] == rows
    assert h["per_rank_bytes"] == process + held + rows
    assert h["per_node_bytes"] == 8 * h["per_rank_bytes"]
    assert h["old_path_per_rank_bytes"] == process + held + m.params * 4  # the whole float32 model, 282 GB
    assert h["per_rank_bytes"] < 0.15 * h["old_path_per_rank_bytes"]
    assert h["limit_per_rank_bytes"] == 200 * 2**30  # sites/h100-cluster.toml: mem_per_task = "200G"
    # nothing offloaded: only the process and one slice
    h, _ = host("h100-cluster", [*LLAMA70, "-o", "actor.fsdp.param_offload=false", "-o", "reference.offload=false"])
    assert h["per_rank_bytes"] == process + rows


def test_plan_shows_host_memory_per_node(capsys):
    assert main(["plan", str(GSM8K), "--site", "h100-cluster"]) == 0
    out = capsys.readouterr().out
    assert "host memory at start-up:" in out and "per node of 8 ranks" in out and "old path" in out


def test_compile_refuses_a_site_whose_ranks_cannot_hold_the_start_up_in_one_line(capsys, tmp_path):
    args = [str(GSM8K), "--site", "h100-cluster", *LLAMA70, "-o", "actor.fsdp.param_offload=true",
            "-o", "site.slurm.mem_per_task=64G", "-o", "rollout.gpu_memory_utilization=0.3"]
    assert main(["compile", *args, "--no-check-paths", "-q", "--runs-root", str(tmp_path)]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hpcppo: error: host memory at start-up:"), err
    assert "site.slurm.mem_per_task = 64G" in err[0]
    assert not list(tmp_path.iterdir())
    # the same with the memory the site gives: no refusal for host memory
    h, _ = host("h100-cluster", [*LLAMA70, "-o", "actor.fsdp.param_offload=true"])
    assert h["per_rank_bytes"] < h["limit_per_rank_bytes"]
