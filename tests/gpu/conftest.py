"""Checks that need a CUDA GPU (and, for the ``vllm``-marked ones, vLLM; for the ``multi_gpu`` ones, 2 GPUs): every
test here is marked ``gpu``.

CI runs ``pytest -m "not gpu"``, which deselects the whole folder. On a GPU machine run them with
``bash tools/gpu_check.sh`` (see docs/gpu.md), which deselects ``multi_gpu`` on a 1-GPU machine and ``vllm`` with
``--no-vllm``. A missing GPU, a missing second GPU or a missing vLLM fails a test with the reason: nothing here is
skipped. Collection imports nothing beyond pytest and the standard library.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import _gpu_launch
from _gpu_launch import REPO, cuda_device_count

_HERE = Path(__file__).resolve().parent


def pytest_configure(config):
    config.addinivalue_line("markers", "vllm: needs vLLM (pip install 'hpcppo[vllm]') and a CUDA GPU")
    config.addinivalue_line("markers", "multi_gpu: needs 2 CUDA GPUs (one NCCL rank per GPU)")


def pytest_runtest_setup(item):  # noqa: ARG001 - the clock of the per-test budget (_gpu_launch.budget) starts here
    _gpu_launch.item_started()


def pytest_collection_modifyitems(items):
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def warm_tiny(tmp_path_factory) -> dict[str, Path]:
    """The warm-started tiny model and its task data (tiny.build_tiny_model_and_data, ~40 s on one CPU thread).

    Its next-token distributions are peaked and end answers with EOS, so log-prob comparisons are sharp (a random
    tiny model mostly repeats its last token with near-uniform probabilities elsewhere). An up-to-date build under
    artifacts/tiny-arith/model is copied instead of rebuilt (the build checks its settings hash either way).
    """
    from hpcppo.tiny import build_tiny_model_and_data

    cuda_device_count()  # no GPU: fail at once rather than after a 40 s build
    root = tmp_path_factory.mktemp("warm-tiny")
    prebuilt = REPO / "artifacts" / "tiny-arith" / "model"
    if (prebuilt / "hpcppo_tiny.json").is_file():
        shutil.copytree(prebuilt, root / "model")
    info = build_tiny_model_and_data(root / "model", root / "data", seed=0, train_size=256, val_size=32)
    return {"model": root / "model", "train": Path(info["data"]["train"]), "val": Path(info["data"]["val"])}
