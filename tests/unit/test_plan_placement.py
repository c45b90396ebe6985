"""``hpcppo plan`` with split placement (issue 35): rollout ranks budgeted apart from trainer ranks, the step time of
both placements of the same GPUs, and which is faster and why."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.compiler import compile_config
from hpcppo.sizing.estimate import estimate
from hpcppo.sizing.steptime import _verdict

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "examples" / "gsm8k-qwen2.5-7b.toml"  # Qwen2.5-7B (the planner's table), 2 x 8 GPUs, vLLM TP 2
SPLIT = ['rollout.placement="split"', "resources.rollout_nodes=1", "rollout.tensor_parallel_size=1"]


def _budget(overrides=(), site="h100-cluster"):
    c = compile_config(GSM8K, site, list(overrides), check_paths=False)
    return estimate(c.site, c.experiment, c.plan), c


def _items(phase) -> dict[str, int]:
    return {i.what: i.bytes for i in phase.items}


def test_rollout_ranks_hold_the_engine_and_trainer_ranks_no_engine():
    split, c = _budget(SPLIT + ["rollout.gpu_memory_utilization=0.9"])
    rollout = split.phases[0]
    assert rollout.name == "rollout rank (vLLM, never sleeps)"
    assert set(_items(rollout)) == {"framework reserve (CUDA context, NCCL)", "vLLM share (gpu_memory_utilization)"}
    assert _items(rollout)["vLLM share (gpu_memory_utilization)"] == int(0.9 * split.gpu.memory_bytes)
    trainer_items = {what for p in split.phases[1:] for what in _items(p)}
    assert not any("vLLM" in what for what in trainer_items) and "actor params (fp32 shard)" in trainer_items
    colocated, _ = _budget()
    assert any("vLLM" in what for p in colocated.phases[1:] for what in _items(p))  # asleep during the updates
    # 4 trainer ranks a node shard the actor's state over 4 GPUs, where the colocated job's (HSDP) shards over 8
    quarter, _ = _budget(['rollout.placement="split"', "resources.rollout_ranks_per_node=4",
                          "rollout.tensor_parallel_size=1"])
    assert _items(quarter.phases[1])["actor params (fp32 shard)"] == 2 * _items(colocated.phases[1])[
        "actor params (fp32 shard)"] == 2 * _items(split.phases[1])["actor params (fp32 shard)"]


def test_a_tensor_parallel_rollout_engine_is_budgeted_per_gpu():
    # TP 2 over the rollout node: each rollout GPU holds half the engine's weights and half its KV heads, so the same
    # share leaves more KV cache; the engine (2 GPUs) is dealt 2 trainer shares
    no_val = ["trainer.test_freq=0", "trainer.val_before_train=false", "rollout.gpu_memory_utilization=0.9"]
    tp2, c2 = _budget(['rollout.placement="split"', "resources.rollout_nodes=1", "rollout.tensor_parallel_size=2"]
                      + no_val)
    tp1, c1 = _budget(SPLIT + no_val)
    m = tp2.model
    assert _items(tp2.phases[0]) == _items(tp1.phases[0])  # the same share of each GPU
    assert tp2.kv["weights_bytes"] == -(-m.params * 2 // 2) and tp1.kv["weights_bytes"] == m.params * 2
    assert tp2.kv["kv_bytes_per_token_per_gpu"] * 2 == tp1.kv["kv_bytes_per_token_per_gpu"]
    assert tp2.kv["kv_cache_bytes"] > tp1.kv["kv_cache_bytes"]
    assert (c2.plan.dp_size, c2.plan.prompts_per_rank, c1.plan.dp_size, c1.plan.prompts_per_rank) == (4, 256, 8, 128)
    assert tp2.kv["sequences_per_engine"] == 256 * 5


def test_an_hf_rollout_rank_holds_the_weights_and_its_batchs_cache():
    budget, c = _budget(SPLIT + ['rollout.engine="hf"'])
    rollout = _items(budget.phases[0])
    m = budget.model
    assert rollout["engine weights (model.dtype)"] == m.params * 2
    assert rollout["KV cache of the batch"] == c.plan.prompts_per_rank * 5 * 1536 * m.kv_bytes_per_token(2)
    assert c.plan.prompts_per_rank == 1024 // 8  # 8 rollout ranks, one engine each


def test_split_overlaps_its_sides_unless_on_policy():
    t = _budget(SPLIT)[0].time
    assert t["step_s"] == pytest.approx(max(t["rollout_side_s"], t["trainer_side_s"]) + t["weight_sync_s"])
    assert t["weight_broadcast_s"] > 0 and t["weight_sync_s"] > t["weight_broadcast_s"]
    t0 = _budget(SPLIT + ["rollout.max_staleness=0"])[0].time
    assert t0["step_s"] == pytest.approx(t0["rollout_side_s"] + t0["trainer_side_s"] + t0["weight_sync_s"])
    colocated = _budget()[0].time
    assert colocated["step_s"] == pytest.approx(colocated["rollout_side_s"] + colocated["trainer_side_s"]
                                                + colocated["weight_sync_s"])
    # the trainers' updates on half the GPUs take twice as long; every GPU of the allocation is paid for
    assert t["forward_and_update_s"] == pytest.approx(2 * colocated["forward_and_update_s"])
    assert t["gpu_hours_per_100_steps"] == pytest.approx(100 * t["step_s"] * 16 / 3600)


def test_a_split_checkpoints_wait_for_its_queue_counts_against_the_signal_lead(caplog):
    # a split checkpoint holds the next max_staleness steps' samples and waits for them (worst case: generating them
    # all); the preemption signal's lead must cover that too
    times = {}
    for k in (0, 1, 2):
        times[k] = _budget(SPLIT + [f"rollout.max_staleness={k}"])[0].time
    assert "checkpoint_queue_wait_s" not in times[0]
    assert [times[k]["checkpoint_queue_wait_s"] for k in (1, 2)] == pytest.approx(
        [times[1]["rollout_side_s"], 2 * times[2]["rollout_side_s"]])
    need = {k: t["step_s"] + t["checkpoint_s"] + t.get("checkpoint_queue_wait_s", 0.0) for k, t in times.items()}
    lead = int(max(need[0], need[1])) + 1
    assert lead < need[2]
    for k in (0, 1, 2):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hpcppo.sizing"):
            _budget(SPLIT + [f"rollout.max_staleness={k}", f"site.slurm.signal_lead_s={lead}"])
        warned = [r.getMessage() for r in caplog.records if "signal_lead_s" in r.getMessage()]
        assert bool(warned) == (k == 2), (k, warned)
    assert "+ its wait for the next 2 steps' samples" in warned[0] and f"at least {math.ceil(1.5 * need[2])}" in warned[0]


def test_plan_compares_both_placements_of_the_same_gpus():
    colocated, _ = _budget()
    this, other = colocated.placements
    assert (this["placement"], other["placement"]) == ("colocated", "split")
    assert other["layout"].startswith("split: 8 trainer ranks, 8 rollout ranks") and other["fits"]
    assert other["gpu_memory_utilization"] == 0.9  # a rollout rank holds its engine alone
    assert this["step_s"] < other["step_s"]
    assert colocated.placement_verdict.startswith(f"colocated is faster: {this['step_s']:,.0f} s a step against "
                                                  f"{other['step_s']:,.0f} s for split")
    assert "each side on fewer GPUs takes longer than the overlap saves" in colocated.placement_verdict
    split, _ = _budget(SPLIT)
    assert [r["placement"] for r in split.placements] == ["split", "colocated"]
    tp1, _ = _budget(["rollout.tensor_parallel_size=1"])  # the same job placed the other way: colocated, TP 1
    assert split.placements[1]["step_s"] == pytest.approx(tp1.placements[0]["step_s"])
    assert other["tensor_parallel_size"] == 1 and "rollout.tensor_parallel_size = 1" in colocated.placement_verdict


def test_a_model_too_big_for_one_gpu_is_compared_with_tensor_parallel_rollout_engines():
    # Qwen2.5-72B on 8 x 8 H100 (TP 8 colocated): no rollout engine of one GPU holds it; the split alternative
    # is the fastest tensor-parallel size that fits (4: 2 leaves too little KV cache, 8 too few engines).
    c = compile_config(REPO / "examples" / "gsm8k-qwen2.5-72b.toml", "h100-cluster", [], check_paths=False)
    budget = estimate(c.site, c.experiment, c.plan)
    this, other = budget.placements
    assert other["placement"] == "split" and other["fits"] and other["tensor_parallel_size"] == 4
    assert "does not fit" not in budget.placement_verdict
    assert "rollout.tensor_parallel_size = 4" in budget.placement_verdict
    tp2 = compile_config(REPO / "examples" / "gsm8k-qwen2.5-72b.toml", "h100-cluster", [
        'rollout.placement="split"', "resources.rollout_ranks_per_node=4", "rollout.tensor_parallel_size=2",
        "rollout.gpu_memory_utilization=0.9"], check_paths=False)
    assert estimate(tp2.site, tp2.experiment, tp2.plan).time["step_s"] > other["step_s"]


def test_the_verdict_says_why_split_wins():
    colocated = {"placement": "colocated", "layout": "colocated: all 16 ranks train and generate", "step_s": 300.0,
                 "rollout_side_s": 200.0, "trainer_side_s": 100.0, "weight_sync_s": 0.0, "rollout_gpus": 16,
                 "trainer_gpus": 16, "max_staleness": 1}
    split = colocated | {"placement": "split", "layout": "split: 4 trainer ranks, 12 rollout ranks", "step_s": 250.0,
                         "rollout_side_s": 240.0, "trainer_side_s": 230.0, "weight_sync_s": 10.0, "rollout_gpus": 12,
                         "trainer_gpus": 4}
    text = _verdict(colocated, split)
    assert text.startswith("split is faster: 250 s a step against 300 s for colocated: all 16 ranks train and "
                           "generate (1.20x): generation and training overlap")
    assert "Split generates on 12 GPUs (240 s) and trains on 4 (230 s), overlapping, plus 10.0 s" in text


def test_plan_json_and_table_carry_the_comparison(capsys):
    assert main(["plan", str(GSM8K), "--site", "h100-cluster", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["placement"] for r in out["placements"]] == ["colocated", "split"]
    assert out["placement_verdict"].startswith("colocated is faster")
    assert main(["plan", str(GSM8K), "--site", "h100-cluster", "-o", SPLIT[0], "-o", SPLIT[1], "-o", SPLIT[2]]) == 0
    text = capsys.readouterr().out
    assert "placements (one step, worst case)" in text and "rollout rank (vLLM, never sleeps)" in text


def test_a_rollout_rank_generates_share_by_share():
    """A rollout rank generates the trainer shares it is dealt one engine call each (hpcppo.rollout.worker): 16 trainer
    shares of 64 prompts on 8 rollout ranks are two calls of 64 x n sequences, twice one such call."""
    one, c1 = _budget(SPLIT + ["trainer.train_batch_size=512"])  # 8 trainers, 8 rollout ranks: one share each
    two, c2 = _budget(SPLIT + ["resources.nodes=3"])  # 16 trainers, 8 rollout ranks: two shares each
    assert c1.plan.prompts_per_step // c1.plan.train_dp_size == c2.plan.prompts_per_step // c2.plan.train_dp_size == 64
    assert (c1.plan.prompts_per_rank, c2.plan.prompts_per_rank) == (64, 128)
    assert two.time["generate_s"] == pytest.approx(2 * one.time["generate_s"])
