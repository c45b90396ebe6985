"""``hpcppo plan`` counts what sharded gradient accumulation keeps and sends (issue 31, item 1): FSDP2 reduce-scatters
every micro-batch, so an update holds the fp32 gradient shard plus at most one layer's unsharded gradients in flight
(never the whole model's), and sends one reduce-scatter per micro-batch; the HSDP all-reduce stays once per optimizer
step (hpcppo.sizing.accumulation)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.compiler import compile_config
from hpcppo.sizing.accumulation import grads_in_flight, micro_batches_per_optimizer_step, reduce_scatter_bytes
from hpcppo.sizing.catalog import ASSUMPTIONS, GIB, GPUS, KNOWN_MODELS
from hpcppo.sizing.estimate import estimate

REPO = Path(__file__).resolve().parents[2]
Q72 = REPO / "examples" / "gsm8k-qwen2.5-72b.toml"
Q7 = REPO / "examples" / "gsm8k-qwen2.5-7b.toml"


def budget_of(path: Path, site: str, overrides=()):
    c = compile_config(path, site, list(overrides), check_paths=False, check_memory=False)
    return estimate(c.site, c.experiment, c.plan), c


def grad_line(budget, phase: str = "actor update", role: str = "actor") -> tuple[str, int]:
    [p] = [p for p in budget.phases if p.name == phase]
    [(what, size)] = [(i.what, i.bytes) for i in p.items if i.what.startswith(f"{role} grads: ")]
    return what, size


def test_the_72b_update_holds_the_fp32_shard_plus_one_layer_in_flight_and_fits(capsys):
    budget, c = budget_of(Q72, "h100-cluster")
    m = KNOWN_MODELS["qwen2.5-72b"]
    shard = math.ceil(m.params * 4 / 64)
    what, size = grad_line(budget)
    assert what.startswith("actor grads: fp32 shard 4.2 GiB + one layer unsharded in flight 7.2 GiB "
                           "(bf16 + fp32 reduce-scatter input, LM head bf16)"), what
    # one decoder layer in bf16 (autograd's) and fp32 (the reduce-scatter input), and the LM head's bf16 gradient
    assert size == shard + m.layer_params * (2 + 4) + m.vocab * m.hidden * 2
    # ... far from the whole model's unsharded fp32 gradient that no-sync accumulation held (~271 GiB per GPU)
    assert size - shard < m.params * 4 / 30
    assert not budget.problems and budget.peak.total < GPUS["h100-80gb"].memory_bytes
    assert main(["plan", str(Q72), "--site", "h100-cluster"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "actor grads: fp32 shard 4.2 GiB + one layer unsharded in flight 7.2 GiB" in out and "fits: peak" in out


def test_the_critic_update_has_its_own_gradient_line(tmp_path):
    budget, c = budget_of(Q7, "a100-cluster", ["algorithm.adv_estimator=gae"])
    m = KNOWN_MODELS["qwen2.5-7b"]
    what, size = grad_line(budget, "critic update", "critic")
    assert size == math.ceil(m.critic_params * 4 / 8) + grads_in_flight(m, m.layer_params, 2, 4)
    assert what.startswith("critic grads: fp32 shard ")


def test_micro_batches_per_optimizer_step_worst_case():
    assert micro_batches_per_optimizer_step(80, 16, 0, 1536) == 5  # fixed rows
    assert micro_batches_per_optimizer_step(10, 2, 6144, 1536) == 3  # 4 full sequences per budget: 4 + 4 + 2
    assert micro_batches_per_optimizer_step(10, 2, 1000, 1536) == 10  # a budget below one sequence: one each
    assert reduce_scatter_bytes(64, 4, 8) == 64 * 4 * 7 / 8 and reduce_scatter_bytes(64, 4, 1) == 0


def test_one_gradient_reduce_scatter_per_micro_batch_on_the_72b_example():
    budget, c = budget_of(Q72, "h100-cluster")
    t, m = budget.time, KNOWN_MODELS["qwen2.5-72b"]
    # 4 optimizer steps (512 / 128 prompts) x 3 micro-batches (10 samples per rank, 4 full sequences of 1,536 tokens
    # per 6,144-token budget): 12 reduce-scatters of the fp32 gradients over the 64 GPUs, across nodes
    assert c.plan.actor_optimizer_steps_per_step == 4 and t["grad_reduce_scatters"] == 12
    assert t["grad_reduce_scatter_bytes_per_gpu"] == pytest.approx(12 * m.params * 4 * 63 / 64)
    link = GPUS["h100-80gb"].network_bytes_s * ASSUMPTIONS["collective efficiency"].value
    assert t["grad_reduce_scatter_link_s"] == pytest.approx(t["grad_reduce_scatter_bytes_per_gpu"] / link)
    # what backward (6N per token of the 8N with checkpointing) cannot hide is in the step
    assert 0 < t["grad_reduce_scatter_s"] < t["grad_reduce_scatter_link_s"]
    assert t["step_s"] == pytest.approx(t["generate_s"] + t["forward_and_update_s"] + t["weight_sync_s"]
                                        + t["grad_reduce_scatter_s"] + t["offload_s"])
    # twice the micro-batches per optimizer step, twice the reduce-scatters and their bytes
    halved, _ = budget_of(Q72, "h100-cluster", ["actor.max_tokens_per_micro_batch=3072"])
    assert halved.time["grad_reduce_scatters"] == 4 * 5  # 2 full sequences per budget: 5 micro-batches of 10 rows
    assert halved.time["grad_reduce_scatter_bytes_per_gpu"] == pytest.approx(20 / 12 * t["grad_reduce_scatter_bytes_per_gpu"])


def test_hsdp_all_reduces_once_per_optimizer_step_whatever_the_micro_batches():
    """7B on 2 x 8 A100 with HSDP: reduce-scatters inside a node, one per micro-batch; the all-reduce across the two
    replicas only at each optimizer step's last micro-batch (``set_requires_all_reduce``)."""
    base, c = budget_of(Q7, "a100-cluster")
    more, _ = budget_of(Q7, "a100-cluster", ["actor.ppo_micro_batch_size_per_gpu=4"])
    assert c.plan.hsdp and c.plan.actor_optimizer_steps_per_step == 4
    assert base.time["grad_reduce_scatters"] == 4 * 5 and more.time["grad_reduce_scatters"] == 4 * 20
    assert more.time["replica_grad_sync_s"] == base.time["replica_grad_sync_s"] > 0
    m = KNOWN_MODELS["qwen2.5-7b"]
    link = GPUS["a100-80gb"].nvlink_bytes_s * ASSUMPTIONS["collective efficiency"].value  # within a node
    assert base.time["grad_reduce_scatter_link_s"] == pytest.approx(20 * m.params * 4 * 7 / 8 / link)
    assert base.time["grad_reduce_scatter_s"] == 0  # NVLink: hidden behind backward
    assert grad_line(base)[1] == math.ceil(m.params * 4 / 8) + grads_in_flight(m, m.layer_params, 2, 4)
    assert grad_line(base)[0].startswith(f"actor grads: fp32 shard {math.ceil(m.params * 4 / 8) / GIB:.1f} GiB")
