"""A tiny mixture-of-experts model on the local default (issue 37 item 7): built through ``make-model``'s MoE path
(``--moe``: ``build_tiny_model_and_data(moe_experts=4, moe_top_k=2)``, warm start shortened), a Qwen3-MoE that
transformers loads as one; two PPO steps of the real job entry point on the HF engine complete, and the weight-sync
guard sees the engine's log-probs equal to the trainer's (float32 on both sides)."""

from __future__ import annotations

import json

import pytest

from hpcppo import metrics as hmetrics
from hpcppo import tiny

from _harness import compile_run, launch_ranks, logs_of, wait_all, write_spec

SMALL = {"steps": 2, "warmup_steps": 1, "eval_every": 1, "eval_size": 8, "batch_size": 16, "flaw_steps": 1,
         "flaw_warmup_steps": 1}


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-moe")
    info = tiny.build_tiny_model_and_data(root / "model", root / "data", seed=0, train_size=256, val_size=32,
                                          moe_experts=4, moe_top_k=2, **SMALL)
    return root, info


def test_make_model_moe_builds_a_qwen3_moe(tiny_moe):
    from transformers import AutoConfig

    root, info = tiny_moe
    assert info["built"] is True and info["architecture"] == "Qwen3MoeForCausalLM"
    raw = json.loads((root / "model" / "config.json").read_text())
    assert raw["model_type"] == "qwen3_moe" and raw["architectures"] == ["Qwen3MoeForCausalLM"]
    assert (raw["decoder_sparse_step"], raw["mlp_only_layers"], raw["moe_intermediate_size"]) == (1, [], 256)
    c = AutoConfig.from_pretrained(root / "model")  # 5.25 saves num_experts as num_local_experts (attribute_map)
    assert (c.num_experts, c.num_experts_per_tok, c.norm_topk_prob) == (4, 2, True)
    again = tiny.build_tiny_model_and_data(root / "model", seed=0, moe_experts=4, moe_top_k=2, **SMALL)
    assert again["built"] is False  # up to date: the MoE settings are in the build's hash


def test_a_tiny_moe_trains_on_the_local_default_with_the_hf_engine(tmp_path, tiny_moe):
    root, _ = tiny_moe
    data = {"model": root / "model", "train": root / "data" / "train.parquet", "val": root / "data" / "val.parquet"}
    spec = write_spec(tmp_path / "exp.toml", data, name="tiny-moe")
    run = compile_run(spec, tmp_path / "runs", ["resources.procs_per_node=1", "trainer.total_steps=2",
                                                "checkpoint.save_every=-1", "trainer.val_before_train=false"])
    assert wait_all(launch_ranks(run, 1, "a0")) == [0], logs_of(run)
    df = hmetrics.load(run)
    assert df["step"].tolist() == [1, 2]
    assert (df["rollout/logprob_gap"] < 1e-5).all(), df["rollout/logprob_gap"].tolist()
    assert df["actor/pg_loss"].notna().all()
