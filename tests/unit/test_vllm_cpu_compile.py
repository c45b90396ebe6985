"""What compile says about ``rollout.engine = "vllm"`` on CPU sites, before any job starts: the CPU sites' defaults
for vLLM's CPU backend (no sleep mode, eager, a fixed KV cache), the refusal of sleep mode there, and an engine that
is not installed in the Python the job will run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hpcppo.compiler import compile_config
from hpcppo.config.compiled import check_engine_installed
from hpcppo.errors import ConfigError, ResolveError

ARITH = Path(__file__).resolve().parents[2] / "examples" / "arith-tiny.toml"
VLLM = ["rollout.engine=vllm"]


@pytest.mark.parametrize("site", ["local", "local-slurm"])
def test_cpu_sites_default_to_what_vllms_cpu_backend_runs(site):
    c = compile_config(ARITH, site, VLLM, check_paths=False)
    ro = c.experiment.rollout
    assert (ro.free_cache_engine, ro.enforce_eager, ro.kv_cache_memory_mb) == (False, True, 256)
    assert {c.provenance[f"rollout.{k}"] for k in ("free_cache_engine", "enforce_eager", "kv_cache_memory_mb")} == {
        "site"}


def test_sleep_mode_written_by_the_user_is_refused_on_a_cpu_site():
    with pytest.raises(ResolveError) as info:
        compile_config(ARITH, "local", [*VLLM, "rollout.free_cache_engine=true"], check_paths=False)
    assert str(info.value) == (
        "rollout.free_cache_engine=true: vLLM's CPU backend has no sleep mode (levels 1 and 2 are both refused), and "
        "site 'local' computes on the CPU; set rollout.free_cache_engine = false (the CPU sites' default)")


def test_a_missing_vllm_in_the_jobs_python_is_refused(monkeypatch):
    c = compile_config(ARITH, "local", VLLM, check_paths=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"vLLM is not installed in .*, the Python site 'local' runs the job with "
                                          r"\(env.python = \"\"\); run tools/setup.sh --vllm"):
        check_engine_installed(c.site, c.experiment)
    # the job's Python is another one: nothing can be known here
    other = compile_config(ARITH, "local", [*VLLM, "site.env.python=/opt/venv/bin/python"], check_paths=False)
    check_engine_installed(other.site, other.experiment)
    # the HF engine needs nothing more
    hf = compile_config(ARITH, "local", [], check_paths=False)
    check_engine_installed(hf.site, hf.experiment)


def test_a_directory_named_vllm_is_not_vllm(monkeypatch):
    c = compile_config(ARITH, "local", VLLM, check_paths=False)
    namespace = importlib.util.spec_from_loader("vllm", loader=None)  # what a bare tests/vllm directory gives
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: namespace)
    with pytest.raises(ConfigError, match="vLLM is not installed"):
        check_engine_installed(c.site, c.experiment)
