"""The job's library versions (hpcppo.train.versions): the vLLM pin checked at start, the record in the run dir."""

from __future__ import annotations

import importlib.metadata
import json
import tomllib
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

from hpcppo.compiler import compile_config
from hpcppo.errors import ConfigError
from hpcppo.rundir import RunPaths
from hpcppo.train import main as job_main
from hpcppo.train import versions

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("version", ["0.32.0", "0.32.4", "0.32.0+cpu", "0.32.1rc1"])
def test_the_tested_minor_passes(version):
    versions.check_vllm(version, allow_untested=False)


@pytest.mark.parametrize("version", ["0.33.0", "0.31.2", "0.27.0+cu130", "1.32.0"])
def test_another_minor_stops_the_job_in_one_line_naming_both(version):
    with pytest.raises(ConfigError) as info:
        versions.check_vllm(version, allow_untested=False)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("rollout.allow_untested_vllm: ")
    assert f"this job's vLLM is {version}, but hpcppo's vLLM engine is tested with 0.32.x" in msg
    versions.check_vllm(version, allow_untested=True)  # the override key lets it run


def test_no_vllm_distribution_is_left_to_the_engine_import():
    versions.check_vllm(None, allow_untested=False)


def test_the_vllm_extra_pins_the_tested_minor():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [req] = [Requirement(r) for r in extras["vllm"]]
    tested = ".".join(map(str, versions.TESTED_VLLM))
    assert req.name == "vllm"
    assert all(req.specifier.contains(v) for v in (f"{tested}.0", f"{tested}.9"))
    assert not any(req.specifier.contains(v) for v in ("0.31.9", "0.33.0", "0.34.0"))


def _compiled(*overrides: str):
    return compile_config(REPO / "examples" / "arith-tiny.toml", "local", list(overrides), check_paths=False)


def test_rank_0_records_the_versions_and_a_vllm_job_checks_its_pin(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCPPO_ATTEMPT", "local-77")
    run = RunPaths(tmp_path / "run")
    job_main.record_and_check_versions(_compiled(), 0, run.path)
    found = json.loads(run.versions("local-77").read_text())
    assert run.versions("local-77") == run.path / "logs" / "attempt-local-77" / "versions.json"
    assert (found["torch"], found["cuda"]) == (torch.__version__, torch.version.cuda)
    assert found["transformers"] == importlib.metadata.version("transformers")
    assert set(found) == {"python", "platform", "torch", "cuda", "transformers", "vllm"}

    monkeypatch.setattr(versions, "distribution_version", lambda *names: "0.33.1" if "vllm" in names else "5.0")
    vllm = ["rollout.engine=vllm", "rollout.free_cache_engine=false"]
    other = tmp_path / "other"
    with pytest.raises(ConfigError, match="this job's vLLM is 0.33.1"):
        job_main.record_and_check_versions(_compiled(*vllm), 1, other)
    assert not other.exists()  # only rank 0 writes
    job_main.record_and_check_versions(_compiled(*vllm, "rollout.allow_untested_vllm=true"), 0, other)
    assert json.loads(RunPaths(other).versions("local-77").read_text())["vllm"] == "0.33.1"
    job_main.record_and_check_versions(_compiled(), 0, other)  # the hf engine does not care which vLLM is there
