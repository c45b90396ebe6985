"""The trainer end to end on one GPU: runs compiled for the local site with one GPU, each started through the job
entry point (``hpcppo.train.main`` under ``_gpu_train.py``, which also probes where the models and optimizer states
were put), 2 PPO steps each:

* plain (HF engine), ending with a DCP checkpoint of CUDA tensors;
* offloads: ``actor.fsdp.param_offload`` + ``optimizer_offload``, ``critic.fsdp.optimizer_offload`` and
  ``reference.offload`` (FSDP2's CPU offload for actor and reference, the optimizer-state offload for the critic);
* resume: a 3-step run that starts from the plain run's step-2 checkpoint (DCP loads onto the GPU) and trains step 3;
* the ``vllm`` engine over the recording stand-in (``tests/_fakes/recording_vllm``, NOT vLLM: the trainer's calls
  and the weights it streams from CUDA), and over real vLLM where it is installed (marked ``vllm``).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from _gpu_launch import DEVICE, REPO, cuda_device_count, require_vllm, run_processes

COLUMNS = ("reward/mean", "actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "kl/actor_ref")
TRAIN = Path(__file__).with_name("_gpu_train.py")
TIMEOUT_S = 240


# The local site's [defaults] are those of its CPU (vLLM's CPU backend: no sleep mode, a 256 MiB KV cache); a GPU
# run of it takes back vLLM's GPU defaults (a CPU dry run keeps the CPU's: compile refuses sleep mode there).
GPU_VLLM = ("rollout.free_cache_engine=true", "rollout.kv_cache_memory_mb=0") if DEVICE == "cuda" else ()


def _compile(warm_tiny: dict[str, Path], root: Path, *overrides: str) -> Path:
    from hpcppo.launch import jobs

    site = ["site.local.gpus_per_node=1"] if DEVICE == "cuda" else ["site.local.procs_per_node=1"]
    crun = jobs.compile_run(REPO / "examples" / "arith-tiny.toml", "local", [
        *site,
        f"model.path={warm_tiny['model']}",
        f"data.train_files=['{warm_tiny['train']}']",
        f"data.val_files=['{warm_tiny['val']}']",
        "model.dtype=bfloat16",  # FSDP computes in bf16 and the rollout engine runs in bf16, as on a real GPU run
        "trainer.test_freq=2",
        "checkpoint.save_every=0",  # one checkpoint, at the end: DCP on CUDA tensors
        *overrides,
    ], runs_root=str(root / "runs"))
    plan = crun.compiled.plan
    assert (plan.device, plan.world_size) == (DEVICE, 1), plan
    return crun.run.path


def _train(run_dir: Path, logs: Path, name: str, *flags: str) -> dict[str, Any]:
    """Run one rank of the job; returns its probe (``_gpu_train.py``) after checking the exit record."""
    probe = logs / f"{name}-probe.json"
    run_processes([sys.executable, str(TRAIN), str(run_dir), str(probe), *flags], 1, logs, f"train-{name}",
                  timeout_s=TIMEOUT_S, extra_env={"HPCPPO_ATTEMPT": "0"})
    assert (run_dir / "control" / "exit-code.0").read_text().strip() == "0"
    result = json.loads(probe.read_text())
    assert result["code"] == 0 and result["built"] == 1, result
    return result


def _check_rows(run_dir: Path, steps: list[int], val_steps: list[int]) -> None:
    from hpcppo import metrics

    df = metrics.load(run_dir)
    train = df[df["step"] > 0]
    assert list(train["step"]) == steps, df[["step"]].to_string()
    for column in COLUMNS:
        values = train[column].tolist()
        assert all(math.isfinite(v) for v in values), (column, values)
    val = df[df["val/score"].notna()]
    assert list(val["step"]) == val_steps, df[["step", "val/score"]].to_string()


def _on_device(where: dict[str, Any]) -> None:
    assert where["dtensor"] and where["devices"] == [DEVICE] and not where["pinned"], where


def _on_host(where: dict[str, Any]) -> None:
    assert where["devices"] == ["cpu"] and (where["pinned"] or DEVICE == "cpu"), where


@pytest.fixture(scope="module")
def plain(warm_tiny, tmp_path_factory) -> dict[str, Any]:
    cuda_device_count()
    root = tmp_path_factory.mktemp("plain")
    run_dir = _compile(warm_tiny, root, "trainer.total_steps=2")
    return {"run_dir": run_dir, "probe": _train(run_dir, root / "logs", "plain")}


def test_trainer_two_steps_on_one_gpu(plain):
    _check_rows(plain["run_dir"], [1, 2], [0, 2])
    probe = plain["probe"]
    assert probe["device"].startswith(DEVICE), probe
    for role in ("actor", "critic", "reference", "actor_optim", "critic_optim"):
        _on_device(probe[role])
    assert (plain["run_dir"] / "checkpoints" / "step-2" / "COMMITTED").exists()


def test_trainer_with_param_optimizer_and_reference_offload(warm_tiny, tmp_path):
    cuda_device_count()
    run_dir = _compile(warm_tiny, tmp_path, "trainer.total_steps=2", "actor.fsdp.param_offload=true",
                       "actor.fsdp.optimizer_offload=true", "critic.fsdp.optimizer_offload=true",
                       "reference.offload=true")
    probe = _train(run_dir, tmp_path / "logs", "offload")
    _check_rows(run_dir, [1, 2], [0, 2])
    # actor and reference: FSDP2's CPU offload (pinned shards; the actor's AdamW state and step on the host too)
    for role in ("actor", "reference", "actor_optim"):
        _on_host(probe[role])
    assert probe["actor_optim"]["count"] > 0, probe
    assert probe["actor_optim_offload"] is False, "param_offload already keeps the actor's state on the host"
    # critic: parameters on the GPU, its AdamW state put back in pinned host memory after every update
    _on_device(probe["critic"])
    assert probe["critic_optim_offload"] is True, probe
    _on_host(probe["critic_optim"])
    assert (run_dir / "checkpoints" / "step-2" / "COMMITTED").exists()


def test_resume_loads_the_checkpoint_onto_the_gpu(plain, warm_tiny, tmp_path):
    run_dir = _compile(warm_tiny, tmp_path, "trainer.total_steps=3")
    shutil.copytree(plain["run_dir"] / "checkpoints" / "step-2", run_dir / "checkpoints" / "step-2")
    probe = _train(run_dir, tmp_path / "logs", "resume")
    log = (tmp_path / "logs" / "train-resume-rank0.log").read_text(errors="replace")
    assert "resumed from checkpoint step 2" in log, log[-3000:]
    _check_rows(run_dir, [3], [])
    for role in ("actor", "critic", "reference", "actor_optim", "critic_optim"):
        _on_device(probe[role])  # DCP loaded the state into the CUDA tensors it found
    assert probe["actor_optim"]["count"] > 0, probe
    assert (run_dir / "checkpoints" / "step-3" / "COMMITTED").exists()


def test_trainer_with_the_recording_vllm_stand_in(warm_tiny, tmp_path):
    """``rollout.engine = "vllm"`` over the recording stand-in: the trainer's calls and the weights it streams from
    CUDA. Not vLLM: what vLLM does with them is test_vllm_engine's (and the real-engine leg below)."""
    cuda_device_count()
    # The job's Python named explicitly: compile cannot refuse this one for lacking vLLM (the stand-in is installed
    # inside it). Sleep mode on and no fixed KV cache, as on a GPU site (the local site's defaults are its CPU's).
    run_dir = _compile(warm_tiny, tmp_path, "trainer.total_steps=2", "rollout.engine=vllm",
                       f"site.env.python={sys.executable}", *GPU_VLLM)
    probe = _train(run_dir, tmp_path / "logs", "recording-vllm", "--recording-vllm")
    _check_rows(run_dir, [1, 2], [0, 2])
    calls = probe["vllm_calls"]
    assert calls.count("LLM") == 1, calls
    assert calls.count("load_weights") >= 2 and calls.count("generate") >= 2, calls  # a sync and a rollout per step
    seen = probe["weights_seen"]
    names = set(probe["actor_names"])
    assert {w["name"] for w in seen} == names, sorted(names ^ {w["name"] for w in seen})
    assert len(seen) % len(names) == 0 and len(seen) // len(names) >= 2, (len(seen), len(names))  # whole syncs
    assert {(w["device"], w["dtype"]) for w in seen} == {(DEVICE, "torch.bfloat16")}, \
        {(w["device"], w["dtype"]) for w in seen}


@pytest.mark.vllm
def test_trainer_with_vllm(warm_tiny, tmp_path):
    cuda_device_count()
    require_vllm()
    run_dir = _compile(warm_tiny, tmp_path, "trainer.total_steps=2", "rollout.engine=vllm",
                       "rollout.gpu_memory_utilization=0.2", "rollout.enforce_eager=true", *GPU_VLLM)
    _train(run_dir, tmp_path / "logs", "vllm")
    _check_rows(run_dir, [1, 2], [0, 2])
