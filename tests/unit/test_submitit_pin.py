"""The Slurm submission overrides a private submitit method (``hpcppo.launch.submit.SUBMITIT_HOOK``): the pin in
pyproject.toml, the installed submitit and the hook must agree, or a submitit upgrade would silently submit
submitit's own sbatch text instead of ``job.sbatch``."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

import submitit
import submitit.core.core
from packaging.requirements import Requirement
from packaging.version import Version

from hpcppo.launch import submit

ROOT = Path(__file__).resolve().parents[2]


def submitit_requirement() -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [req] = [Requirement(d) for d in deps if Requirement(d).name == "submitit"]
    return req


def test_the_pin_is_a_bounded_range_below_the_next_minor() -> None:
    spec = submitit_requirement().specifier
    assert Version("1.5.4") in spec
    assert Version("1.6.0") not in spec and Version("1.5.3") not in spec, spec


def test_the_installed_submitit_is_in_the_pinned_range() -> None:
    assert Version(submitit.__version__) in submitit_requirement().specifier, submitit.__version__


def test_the_hook_exists_with_the_signature_we_override() -> None:
    hook = getattr(submitit.SlurmExecutor, submit.SUBMITIT_HOOK)
    assert list(inspect.signature(hook).parameters) == ["self", "command", "uid"]
    ours = getattr(submit._slurm_executor_class(), submit.SUBMITIT_HOOK)
    assert list(inspect.signature(ours).parameters) == ["self", "command", "uid"]
    assert ours is not hook


def test_submitit_writes_the_submission_file_from_the_hook() -> None:
    """The one place submitit writes the file sbatch gets: ``PicklingExecutor._submit_command`` calls the hook."""
    source = inspect.getsource(submitit.core.core.PicklingExecutor._submit_command)
    assert f"self.{submit.SUBMITIT_HOOK}(command, tmp_uuid)" in source


def test_the_override_returns_our_script_verbatim(tmp_path, monkeypatch) -> None:
    """Without a cluster: submitit's constructor only asks whether srun exists."""
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 1))
    script = "#!/bin/bash\n#SBATCH --nodes=1\necho 'ours'\n"
    executor = submit._slurm_executor_class()(folder=tmp_path, script_text=script)
    assert getattr(executor, submit.SUBMITIT_HOOK)("python -m submitit.core._submit x", "uid") == script
