"""``hpcppo plan`` and the memory check of ``hpcppo compile``, through ``hpcppo.cli.main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcppo.cli import main
from hpcppo.sizing.catalog import GPUS

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "examples" / "gsm8k-qwen2.5-7b.toml"
NO_OFFLOAD_32B = ["-o", "model.path=Qwen/Qwen2.5-32B-Instruct", "-o", "actor.fsdp.param_offload=false",
                  "-o", "actor.fsdp.optimizer_offload=false"]


def test_plan_json(capsys):
    assert main(["plan", str(GSM8K), "--site", "a100-cluster", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["site"] == "a100-cluster" and out["gpu"] == "a100-80gb" and out["world_size"] == 16
    assert out["model"]["name"] == "Qwen2.5-7B" and out["shard_size"] == 8
    assert {p["name"] for p in out["phases"]} == {"rollout (vLLM awake)", "old log-probs / reference / values",
                                                  "actor update"}  # GRPO: no critic
    assert max(p["total_bytes"] for p in out["phases"]) < GPUS["a100-80gb"].memory_bytes
    assert out["problems"] == []
    assert out["kv_cache"]["kv_bytes_per_token_model"] == 57344
    assert out["time"]["step_s"] > 0 and out["time"]["gpu_hours_per_100_steps"] > 0
    # Every constant says where it comes from.
    assert out["constants"] and all(c["source"] for c in out["constants"])
    assert {"a100-80gb HBM bandwidth", "a100-80gb dense bf16", "train MFU"} <= {c["name"] for c in out["constants"]}


def test_plan_table(capsys):
    assert main(["plan", str(GSM8K), "--site", "h100-cluster"]) == 0
    out = capsys.readouterr().out
    for text in ("rollout (vLLM awake)", "actor update", "KV cache tokens", "GPU-hours per 100 steps",
                 "h100-80gb HBM bandwidth", "https://arxiv.org/abs/2407.21783", "fits: peak"):
        assert text in out, text


def test_plan_shows_what_does_not_fit_and_compile_refuses_in_one_line(capsys, tmp_path):
    args = [str(GSM8K), "--site", "h100-cluster", *NO_OFFLOAD_32B]
    assert main(["plan", *args]) == 0
    assert "does not fit: rollout (vLLM awake) needs" in capsys.readouterr().out
    assert main(["compile", *args, "--no-check-paths", "-q", "--runs-root", str(tmp_path)]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hpcppo: error: rollout (vLLM awake) needs")
    assert "actor.fsdp.param_offload = true" in err[0]
    assert not list(tmp_path.iterdir())  # refused before a run directory appears


def test_plan_rejects_an_unknown_gpu_kind(capsys):
    assert main(["plan", str(GSM8K), "--site", "a100-cluster", "-o", "site.gpu=a100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gpu" in err[0] and "is not allowed" in err[0]
    assert "a100-80gb" in err[0] and "h200-141gb" in err[0]


def test_plan_on_a_cpu_site_says_it_does_not_judge(capsys):
    assert main(["plan", str(REPO / "examples" / "arith-tiny.toml"), "--site", "local"]) == 0
    out = capsys.readouterr().out
    assert "GPU kind unknown" in out


def _plan_json(capsys, *overrides: str) -> dict:
    args = [a for o in overrides for a in ("-o", o)]
    assert main(["plan", str(GSM8K), "--site", "h100-cluster", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)["time"]


def test_plan_counts_remax_baselines_and_validation_at_val_n(capsys, tmp_path):
    """ReMax decodes a greedy response per prompt each step beside the rollout; a validation decodes every
    validation prompt val_n times, in calls of 64 prompts per rollout group, test_freq steps apart."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    val = tmp_path / "val.parquet"
    pq.write_table(pa.table({"prompt": ["q"] * 1000}), val)
    base = _plan_json(capsys)
    assert base["baseline_generate_s"] == 0 and "validation_s" not in base  # ~/data/gsm8k/test.parquet: not here
    remax = _plan_json(capsys, "algorithm.adv_estimator=remax")
    assert remax["generate_s"] == base["generate_s"] and 0 < remax["baseline_generate_s"] < base["generate_s"]
    assert remax["step_s"] == pytest.approx(base["step_s"] + remax["baseline_generate_s"])

    files = f'data.val_files=["{val}"]'
    one, four = _plan_json(capsys, files), _plan_json(capsys, files, "rollout.val_n=4")
    assert one["validation_prompts"] == four["validation_prompts"] == 1000
    assert one["step_s"] == four["step_s"] and 1.5 * one["validation_s"] < four["validation_s"]
    freq = 5  # the example's trainer.test_freq: 20 validations in 100 steps, 21 in 100 with the one before training
    assert four["gpu_hours_per_100_steps"] == pytest.approx(base["gpu_hours_per_100_steps"]
                                                            + 100 / freq * four["validation_s"] * 16 / 3600)
    total = _plan_json(capsys, files, "rollout.val_n=4", "trainer.total_steps=100")
    assert total["gpu_hours"] == pytest.approx(total["gpu_hours_per_100_steps"] + four["validation_s"] * 16 / 3600)
