"""FSDP2 on CUDA with the trainer's settings: bf16 compute, fp32 master weights and reduction, with and without
CPU offload (pinned host shards); one forward/backward/AdamW step; ``iter_full_params`` equals the weights."""

from __future__ import annotations

import math

import pytest

from _gpu_launch import require_gpus, run_scenario


@pytest.fixture(scope="module", params=[1, pytest.param(2, marks=pytest.mark.multi_gpu)], ids=lambda w: f"{w}rank")
def fsdp_results(request, tmp_path_factory):
    require_gpus(request.param)
    return run_scenario("fsdp", request.param, tmp_path_factory.mktemp(f"fsdp{request.param}"), timeout_s=240)


@pytest.mark.parametrize("variant", ["plain", "offload"])
def test_fsdp_bf16_step(fsdp_results, variant):
    for rank, result in enumerate(fsdp_results):
        assert result["device_type"] == "cuda"
        r = result[variant]
        where = f"rank {rank}, {variant}: {r}"
        assert r["all_dtensor"], where
        assert r["master_dtypes"] == ["torch.float32"], where
        # what the first Linear saw during forward: FSDP's gathered bf16 copy, not the fp32 master
        assert r["compute_dtypes"] == ["torch.bfloat16"], where
        assert r["grads_present"] and r["grads_finite"], where
        assert r["grad_dtypes"] == ["torch.float32"], where
        if variant == "offload":
            assert r["local_devices"] == ["cpu"] and r["all_pinned"], where
        else:
            assert r["local_devices"] == ["cuda"], where
        assert math.isfinite(r["loss"]), where
        # bf16 compute vs the fp32 unsharded model on the same tokens (~1e-4 apart on CPU; a wrong layer would be O(1))
        assert abs(r["loss"] - r["ref_loss"]) < 0.05, where
        assert r["loss_after"] < r["loss"], f"one AdamW step on the same batch must lower the loss; {where}"
        assert r["stream_names_match"] and r["stream_max_err_initial"] == 0.0, where
        assert r["max_update"] > 0, where
        if rank == 0:
            assert r["state_dict_names_covered"] and r["stream_max_err_after"] == 0.0, where
