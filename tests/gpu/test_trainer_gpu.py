"""The trainer end to end on one GPU: a run compiled for the local site with one GPU, started through the job
entry point (``python -m hpcppo.train.main RUN_DIR``) as the launchers start it, 2 PPO steps, both engines."""

from __future__ import annotations

import math
import sys

import pytest

from _gpu_launch import REPO, cuda_device_count, require_vllm, run_processes

COLUMNS = ("reward/mean", "actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "kl/actor_ref")


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_trainer_two_steps_on_one_gpu(engine, warm_tiny, tmp_path):
    cuda_device_count()
    if engine == "vllm":
        require_vllm()
    from hpcppo import metrics
    from hpcppo.launch import jobs

    overrides = [
        "site.local.gpus_per_node=1",
        f"model.path={warm_tiny['model']}",
        f"data.train_files=['{warm_tiny['train']}']",
        f"data.val_files=['{warm_tiny['val']}']",
        "model.dtype=bfloat16",  # FSDP computes in bf16 and the rollout engine runs in bf16, as on a real GPU run
        f"rollout.engine={engine}",
        "trainer.total_steps=2",
        "trainer.test_freq=2",
        "checkpoint.save_every=0",  # one checkpoint, at the end: DCP on CUDA tensors
    ]
    if engine == "vllm":
        overrides += ["rollout.gpu_memory_utilization=0.2", "rollout.enforce_eager=true"]
    crun = jobs.compile_run(REPO / "examples" / "arith-tiny.toml", "local", overrides, runs_root=str(tmp_path / "runs"))
    plan = crun.compiled.plan
    assert (plan.device, plan.world_size) == ("cuda", 1), plan
    run_dir = crun.run.path
    run_processes([sys.executable, "-m", "hpcppo.train.main", str(run_dir)], 1, tmp_path / "logs", f"train-{engine}",
                  timeout_s=420, extra_env={"HPCPPO_ATTEMPT": "0"})
    assert (run_dir / "control" / "exit-code.0").read_text().strip() == "0"
    df = metrics.load(run_dir)
    train = df[df["step"] > 0]
    assert list(train["step"]) == [1, 2], df[["step"]].to_string()
    for column in COLUMNS:
        values = train[column].tolist()
        assert all(math.isfinite(v) for v in values), (column, values)
    val = df[df["val/score"].notna()]
    assert list(val["step"]) == [0, 2], df[["step", "val/score"]].to_string()
