"""The rollout engine kinds' registry (torch-free) and what the config and the sizing read from it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpcppo import engines


def test_the_kinds_and_their_properties():
    hf, vllm = engines.lookup("hf"), engines.lookup("vllm")
    assert engines.names() == ("hf", "vllm")
    assert not (hf.needs_vllm or hf.sleeps or hf.kv_cache_share or hf.tensor_parallel or hf.timed_weight_sync)
    assert vllm.needs_vllm and vllm.sleeps and not vllm.sleeps_on_cpu and vllm.kv_cache_share
    assert vllm.tensor_parallel and vllm.timed_weight_sync and vllm.label == "vLLM"
    with pytest.raises(ValueError, match=r"unknown rollout engine 'sglang'; known engines: hf, vllm"):
        engines.lookup("sglang")


def test_the_config_takes_its_choices_from_the_registry():
    from hpcppo.config.experiment import RolloutSection
    from hpcppo.config.fields import FieldValueError

    assert RolloutSection(engine="vllm").engine == "vllm"
    with pytest.raises((FieldValueError, ValueError), match='allowed values: "hf", "vllm"'):
        RolloutSection(engine="sglang")


def test_the_registry_imports_no_torch():
    code = "import sys, hpcppo.engines; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
