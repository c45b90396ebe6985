"""Environment variables every hpcppo job sets, whatever the site: one table for the rendered job scripts
(``templates/partials/environment.j2``) and for the trainer itself (``hpcppo.train.main``), which applies it again
for jobs started some other way (torchrun, a container started with ``--cleanenv``). No torch import here.

A value already in the environment always wins: the scripts export ``NAME="${NAME:-default}"`` before the site's own
``env.vars``, and the trainer only fills in what is missing.
"""

from __future__ import annotations

from collections.abc import MutableMapping

# Compute nodes usually have no route to the internet: vLLM's usage report (vllm/usage/usage_lib.py reads
# VLLM_NO_USAGE_STATS and DO_NOT_TRACK) and Hugging Face's telemetry (huggingface_hub reads DO_NOT_TRACK) must not
# try to phone home from every rank.
OFFLINE: tuple[tuple[str, str], ...] = (("VLLM_NO_USAGE_STATS", "1"), ("DO_NOT_TRACK", "1"))

# torch.use_deterministic_algorithms(True) makes CUDA matmuls raise unless cuBLAS runs with a fixed workspace, and
# cuBLAS reads this variable when torch creates its handle, at the first matmul: it must be set before that.
# ":4096:8" is one of the two values torch's reproducibility notes name (8 buffers of 4 MiB).
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def job_defaults(*, deterministic: bool) -> list[tuple[str, str]]:
    """The (name, value) pairs a job sets when the environment does not already have them."""
    pairs = list(OFFLINE)
    if deterministic:
        pairs.append(("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG))
    return pairs


def apply_job_defaults(environ: MutableMapping[str, str], *, deterministic: bool) -> dict[str, str]:
    """Set each of :func:`job_defaults` that ``environ`` lacks (an empty value counts as missing, as ``${NAME:-x}``
    does in the scripts); return what was set."""
    added = {name: value for name, value in job_defaults(deterministic=deterministic) if not environ.get(name)}
    environ.update(added)
    return added
