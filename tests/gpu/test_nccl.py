"""NCCL through hpcppo's own path: ``detect_env(device_type="cuda")`` + ``init_distributed``, all-reduce results,
and ``run_preflight`` writing ``preflight.json``, on 1 rank (and on 2 where the machine has 2 GPUs)."""

from __future__ import annotations

import pytest

from _gpu_launch import require_gpus, run_scenario


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=pytest.mark.multi_gpu)])
def test_nccl_allreduce_and_preflight(world, tmp_path):
    require_gpus(world)
    from hpcppo.train.preflight import SWEEP_BYTES

    results = run_scenario("nccl", world, tmp_path, timeout_s=180)
    for rank, r in enumerate(results):
        assert (r["backend"], r["env_backend"]) == ("nccl", "nccl"), r
        assert (r["rank"], r["env_rank"], r["world"]) == (rank, rank, world)
        assert r["current_device"] == rank, "init_distributed must select cuda:<local_rank>"
        assert r["sum_min"] == r["sum_max"] == r["sum_expected"], r
        assert r["random_max_err"] < 1e-5, r["random_max_err"]
        assert r["preflight_code"] == 0
    report = results[0]["preflight"]
    assert (tmp_path / "run" / "preflight.json").is_file()
    assert report["ok"] is True and report["backend"] == "nccl" and report["world_size"] == world
    assert all(check["ok"] for check in report["checks"].values()), report["checks"]
    assert [rec["gpus"]["count"] >= world for rec in report["ranks"]] == [True] * world, report["ranks"]
    assert [row["bytes"] for row in report["bandwidth"]] == list(SWEEP_BYTES)
    assert all(row["algbw_GBps"] > 0 for row in report["bandwidth"]), report["bandwidth"]
