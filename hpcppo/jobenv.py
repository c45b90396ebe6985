"""Environment variables every hpcppo job sets, whatever the site: one table for the rendered job scripts
(``templates/partials/environment.j2``) and for the trainer itself (``hpcppo.train.main``), which applies it again
for jobs started some other way (torchrun, a container started with ``--cleanenv``). No torch import here.

A value already in the environment always wins: the scripts export ``NAME="${NAME:-default}"`` before the site's own
``env.vars``, and the trainer only fills in what is missing.
"""

from __future__ import annotations

import random
import re
from collections.abc import MutableMapping

# Rendezvous ports: MASTER_PORT = PORT_BASE + job id % PORT_SPAN, derived by the batch script
# (templates/partials/rendezvous.j2, from these numbers) and by the trainer for jobs started another way. The range
# is above the well-known/registered ports that clusters often firewall and below the Linux ephemeral range (32768+),
# where a derived port could collide with an outgoing socket.
PORT_BASE = 15000
PORT_SPAN = 15000

# Compute nodes usually have no route to the internet: vLLM's usage report (vllm/usage/usage_lib.py reads
# VLLM_NO_USAGE_STATS and DO_NOT_TRACK) and Hugging Face's telemetry (huggingface_hub reads DO_NOT_TRACK) must not
# try to phone home from every rank.
OFFLINE: tuple[tuple[str, str], ...] = (("VLLM_NO_USAGE_STATS", "1"), ("DO_NOT_TRACK", "1"))

# torch.use_deterministic_algorithms(True) makes CUDA matmuls raise unless cuBLAS runs with a fixed workspace, and
# cuBLAS reads this variable when torch creates its handle, at the first matmul: it must be set before that.
# ":4096:8" is one of the two values torch's reproducibility notes name (8 buffers of 4 MiB).
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def port_from_job_id(job_id: str) -> int:
    """A deterministic rendezvous port for a job: every task of the job derives the same one.

    >>> port_from_job_id("12345")
    27345
    """
    digits = re.sub(r"\D", "", job_id)
    if digits:
        return PORT_BASE + int(digits) % PORT_SPAN
    # Non-numeric ids (submitit's local executor uses the pid; be robust anyway): a seeded draw.
    return PORT_BASE + random.Random(job_id).randrange(PORT_SPAN)


def bridge_port(master_port: int) -> int:
    """The port of a split job's bridge store (hpcppo.placement.task_env), on the same host as the rendezvous: half
    the span away from ``MASTER_PORT`` inside the job-id range, so that two jobs of consecutive ids sharing a first
    node do not meet (job ``i``'s bridge is job ``i + PORT_SPAN / 2``'s rendezvous); outside it, the next port.

    >>> bridge_port(port_from_job_id("12345")), bridge_port(29999), bridge_port(29500)
    (19845, 22499, 22000)
    """
    if PORT_BASE <= master_port < PORT_BASE + PORT_SPAN:
        return PORT_BASE + (master_port - PORT_BASE + PORT_SPAN // 2) % PORT_SPAN
    return master_port + 1 if master_port < 65535 else master_port - 1


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
