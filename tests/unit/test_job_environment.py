"""What every job sets in its environment (hpcppo.jobenv): no usage reports from compute nodes without internet,
and cuBLAS's fixed workspace when ``trainer.deterministic`` is on (torch raises at the first CUDA matmul without it).
Set by the rendered Slurm and local scripts, again by the trainer's entry point, never over a value already set."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hpcppo import jobenv
from hpcppo.compiler import compile_config
from hpcppo.launch import render

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"
GSM8K = REPO / "examples" / "gsm8k-qwen2.5-7b.toml"
RUN_DIR = Path("/runs/example-20260101-000000-abcd")
OFFLINE = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
ALL = [*OFFLINE, "CUBLAS_WORKSPACE_CONFIG"]


def test_job_defaults_fill_only_what_is_missing():
    assert dict(jobenv.job_defaults(deterministic=False)) == OFFLINE
    assert dict(jobenv.job_defaults(deterministic=True)) == OFFLINE | {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    environ = {"DO_NOT_TRACK": "0", "CUBLAS_WORKSPACE_CONFIG": "", "PATH": "/bin"}
    added = jobenv.apply_job_defaults(environ, deterministic=True)
    assert added == {"VLLM_NO_USAGE_STATS": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}  # empty counts as unset
    assert environ == {"DO_NOT_TRACK": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PATH": "/bin",
                       "VLLM_NO_USAGE_STATS": "1"}


def _script(spec: Path, site: str, overrides: list[str], python: str = "python3", run_dir: Path = RUN_DIR) -> str:
    c = compile_config(spec, site, ["watchdog.enable=false", *overrides], check_paths=False)
    return render.render(c.site, c.experiment, c.plan, run_dir, python=python)


@pytest.mark.parametrize("spec,site", [(ARITH, "local"), (ARITH, "local-slurm"), (GSM8K, "a100-cluster"),
                                       (GSM8K, "h100-cluster")])
@pytest.mark.parametrize("deterministic", [False, True])
def test_every_rendered_script_exports_the_defaults(spec, site, deterministic):
    text = _script(spec, site, [f"trainer.deterministic={str(deterministic).lower()}"])
    for name, value in OFFLINE.items():
        assert f'export {name}="${{{name}:-{value}}}"\n' in text
    line = 'export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"\n'
    assert (line in text) == deterministic
    # Before the site's own variables, so a site's env.vars can still set another value.
    if site == "a100-cluster":
        assert text.index("DO_NOT_TRACK") < text.index("export HF_HOME=")


def _fake_python(tmp_path: Path) -> Path:
    """A stand-in for the job's interpreter: prints the variables it was started with, as JSON."""
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!{sys.executable}\nimport json, os\n"
                    f"print(json.dumps({{k: os.environ.get(k) for k in {ALL!r}}}))\n")
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize("preset", [{}, {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "DO_NOT_TRACK": "0"}])
def test_the_local_script_runs_the_trainer_with_them_and_keeps_what_was_set(tmp_path, preset):
    import json

    script = tmp_path / "job.sbatch"
    # A run directory that exists: the local script starts in it (not in the caller's cwd).
    script.write_text(_script(ARITH, "local", ["trainer.deterministic=true"], python=str(_fake_python(tmp_path)),
                              run_dir=tmp_path))
    env = {k: v for k, v in os.environ.items() if k not in ALL} | preset | {"HPCPPO_ATTEMPT": "local-1"}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == OFFLINE | {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"} | preset


def test_the_entry_point_sets_them_before_the_process_group_exists(tmp_path, monkeypatch):
    """A recording stand-in for init_distributed looks at the environment the moment the trainer would first touch
    the device: the defaults are there, for a job not started by our scripts (torchrun, a --cleanenv container)."""
    import hpcppo.config
    import hpcppo.distributed.env as dist_env
    from hpcppo.train import main as train_main

    compiled = compile_config(ARITH, "local", ["trainer.deterministic=true"], check_paths=False)
    monkeypatch.setattr(hpcppo.config, "load_resolved", lambda path: compiled)
    for name in ALL:
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    monkeypatch.setenv("DO_NOT_TRACK", "0")  # a value the user set stays
    seen: dict[str, str | None] = {}

    class Stop(Exception):
        pass

    def recording_init(env, **kwargs):
        seen.update({k: os.environ.get(k) for k in ALL})
        raise Stop

    monkeypatch.setattr(dist_env, "init_distributed", recording_init)
    with pytest.raises(Stop):
        train_main.run(tmp_path)
    assert seen == {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


@pytest.mark.parametrize("preset,expected", [(None, ":4096:8"), (":16:8", ":16:8")])
def test_enable_determinism_sets_the_workspace_before_turning_deterministic_algorithms_on(monkeypatch, preset,
                                                                                         expected):
    import torch

    from hpcppo.train import build

    environ = {} if preset is None else {"CUBLAS_WORKSPACE_CONFIG": preset}
    calls = []
    # Recording stand-in for torch's switch: what the environment held when it was turned on.
    monkeypatch.setattr(torch, "use_deterministic_algorithms",
                        lambda mode: calls.append((mode, environ.get("CUBLAS_WORKSPACE_CONFIG"))))
    build.enable_determinism(environ)
    assert calls == [(True, expected)]


def test_verl_full_determinism_reaches_the_job_script(tmp_path):
    """verl's ``fsdp_config.full_determinism`` maps onto trainer.deterministic, hence onto the workspace export."""
    from hpcppo.verl.importer import read_command_line, to_toml, translate

    text = (REPO / "tests" / "unit" / "verl_inputs" / "quickstart.txt").read_text()
    assert " trainer.total_epochs=15 " in text
    text = text.replace(" trainer.total_epochs=15 ",
                        " trainer.total_epochs=15 actor_rollout_ref.actor.fsdp_config.full_determinism=True ")
    settings, _ = read_command_line(text)
    imp = translate(settings)
    spec = tmp_path / "spec.toml"
    spec.write_text(to_toml(imp, "quickstart.txt"))
    assert tomllib.loads(spec.read_text())["trainer"]["deterministic"] is True
    c = compile_config(spec, "a100-cluster", check_paths=False)
    assert c.experiment.trainer.deterministic
    text = render.render(c.site, c.experiment, c.plan, RUN_DIR, python="python3")
    assert 'export CUBLAS_WORKSPACE_CONFIG="${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"' in text
