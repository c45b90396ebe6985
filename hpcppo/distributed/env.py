"""Where this process sits in the job: rank, world, nodes, rendezvous address; process-group life cycle.

``detect_env`` is pure: it reads one environment mapping and returns a ``DistEnv``. It recognises, in order,

1. torchrun (and anything that exports the same variables, e.g. ``submitit``'s
   ``TorchDistributedEnvironment().export()``): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
   ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``;
2. Slurm tasks started by ``srun``: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``,
   ``SLURM_NNODES``, ``SLURM_NTASKS_PER_NODE`` or ``SLURM_TASKS_PER_NODE`` (``2(x2)``, ``4,2``), with
   ``MASTER_ADDR``/``MASTER_PORT`` exported by our sbatch script (fallbacks: the first host of
   ``SLURM_JOB_NODELIST`` and a port derived from ``SLURM_JOB_ID``);
3. submitit's local executor: ``SUBMITIT_EXECUTOR=local`` with ``SUBMITIT_LOCAL_*``;
4. nothing: a single process.

Everything else in this module touches ``torch.distributed`` and is thin.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs
import torch
import torch.distributed as dist

from hpcppo.errors import ConfigError
from hpcppo.jobenv import port_from_job_id

DeviceType = Literal["cpu", "cuda"]

@attrs.frozen
class DistEnv:
    """This process's place in the job. ``node_rank`` counts nodes from 0; ``local_*`` count within a node."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    device_type: DeviceType
    backend: Literal["gloo", "nccl"]
    source: str = "single"
    """Which launcher's variables were read: ``torchrun``, ``slurm``, ``submitit-local`` or ``single``."""
    device_index: int = attrs.field(default=attrs.Factory(lambda self: self.local_rank, takes_self=True))
    """The CUDA device this rank computes on, among those it can see (:func:`cuda_device_index`): ``local_rank``
    when the task sees all of its node's GPUs, 0 when the site gave it a single one."""

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def _int(environ: Mapping[str, str], key: str, default: int | None = None) -> int:
    raw = environ.get(key)
    if raw is None or raw == "":
        if default is None:
            raise ConfigError("required environment variable is not set", key=key)
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"expected an integer, got {raw!r}", key=key) from None


def expand_tasks_per_node(spec: str) -> list[int]:
    """Expand Slurm's compact task counts, one entry per node.

    >>> expand_tasks_per_node("2(x3),1")
    [2, 2, 2, 1]
    """
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ConfigError(f"cannot parse {spec!r}: expected e.g. '2(x2)' or '4,2'", key="SLURM_TASKS_PER_NODE")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def first_host(nodelist: str) -> str:
    """The first host of a Slurm compact host list, without calling ``scontrol``.

    >>> first_host("gpu[003-005,9],cpu1")
    'gpu003'
    """
    m = re.match(r"\s*([^,\[\s]+)(?:\[([^\]]+)\])?", nodelist)
    if not m:
        raise ConfigError(f"cannot parse the host list {nodelist!r}", key="SLURM_JOB_NODELIST")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def cuda_device_index(local_rank: int, local_world_size: int, visible: str | None) -> int:
    """The index, among the GPUs this task can see, of the one it computes on.

    ``visible`` is ``CUDA_VISIBLE_DEVICES`` (``None`` when unset: every GPU of the node is visible). hpcppo runs
    one rank per GPU; the rank ``r`` of a node takes ``cuda:r`` when the task sees all of the job's GPUs on the node
    (Slurm's default without a binding), and ``cuda:0`` when Slurm bound one GPU to each task
    (``--gpus-per-task=1``, ``--gpu-bind=single:1``, a site default): there ``cuda:<local rank>`` does not exist.
    Any other count cannot be mapped to one GPU per rank and is an error naming the variable.

    >>> cuda_device_index(3, 4, None), cuda_device_index(3, 4, "0,1,2,3"), cuda_device_index(3, 4, "3")
    (3, 3, 0)
    """
    if visible is None:
        return local_rank
    devices = [d for d in visible.split(",") if d.strip()]
    if len(devices) >= local_world_size and local_rank < len(devices):
        return local_rank
    if len(devices) == 1:
        return 0
    raise ConfigError(f"this task sees {len(devices)} GPU(s) ({visible!r}) but its node runs {local_world_size} "
                      f"ranks: hpcppo needs each task to see either all of the job's GPUs on the node or exactly "
                      f"one (site.slurm.gpu_bind sets srun's --gpu-bind)", key="CUDA_VISIBLE_DEVICES")


def _validate(env: DistEnv) -> DistEnv:
    checks = [
        (0 <= env.rank < env.world_size, f"rank {env.rank} is outside world size {env.world_size}"),
        (0 <= env.local_rank < env.local_world_size,
         f"local rank {env.local_rank} is outside local world size {env.local_world_size}"),
        (0 <= env.node_rank < env.num_nodes, f"node rank {env.node_rank} is outside {env.num_nodes} nodes"),
        (0 < env.master_port < 65536, f"master port {env.master_port} is not a TCP port"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"inconsistent distributed environment ({env.source}): {message}")
    return env


def _default_device_type() -> DeviceType:
    return "cuda" if torch.cuda.is_available() else "cpu"


def detect_env(environ: Mapping[str, str] = os.environ, *, device_type: DeviceType | None = None) -> DistEnv:
    """Read this process's ``DistEnv`` from ``environ`` (see the module docstring for the order).

    ``device_type`` defaults to ``cuda`` when a GPU is visible; the backend follows (``nccl`` / ``gloo``). On CUDA
    the rank's device follows ``CUDA_VISIBLE_DEVICES`` (:func:`cuda_device_index`).
    Raises ``ConfigError`` naming the variable when one is malformed or the values contradict each other.
    """
    env = _launcher_env(environ, device_type or _default_device_type())
    if env.device_type != "cuda":
        return env
    index = cuda_device_index(env.local_rank, env.local_world_size, environ.get("CUDA_VISIBLE_DEVICES"))
    return attrs.evolve(env, device_index=index)


def _launcher_env(environ: Mapping[str, str], dev: DeviceType) -> DistEnv:
    common: dict[str, Any] = {"device_type": dev, "backend": "nccl" if dev == "cuda" else "gloo"}
    master_addr = environ.get("MASTER_ADDR") or ""

    if "RANK" in environ and "WORLD_SIZE" in environ:
        world = _int(environ, "WORLD_SIZE")
        local_world = _int(environ, "LOCAL_WORLD_SIZE", world)
        return _validate(DistEnv(
            rank=_int(environ, "RANK"),
            local_rank=_int(environ, "LOCAL_RANK", 0),
            world_size=world,
            local_world_size=local_world,
            node_rank=_int(environ, "GROUP_RANK", _int(environ, "RANK") // local_world),
            num_nodes=max(1, world // local_world),
            master_addr=master_addr or "127.0.0.1",
            master_port=_int(environ, "MASTER_PORT", 29500),
            source="torchrun",
            **common,
        ))

    if "SLURM_PROCID" in environ:
        node_rank = _int(environ, "SLURM_NODEID", 0)
        num_nodes = _int(environ, "SLURM_NNODES", _int(environ, "SLURM_JOB_NUM_NODES", 1))
        if environ.get("SLURM_NTASKS_PER_NODE"):
            local_world = _int(environ, "SLURM_NTASKS_PER_NODE")
        elif environ.get("SLURM_TASKS_PER_NODE"):
            per_node = expand_tasks_per_node(environ["SLURM_TASKS_PER_NODE"])
            if node_rank >= len(per_node):
                raise ConfigError(f"node {node_rank} is not covered by {environ['SLURM_TASKS_PER_NODE']!r}",
                                  key="SLURM_TASKS_PER_NODE")
            local_world = per_node[node_rank]
        else:
            local_world = _int(environ, "SLURM_NTASKS", 1) // num_nodes
        if not master_addr:
            nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
            master_addr = first_host(nodelist) if nodelist else "127.0.0.1"
        port = (_int(environ, "MASTER_PORT") if environ.get("MASTER_PORT")
                else port_from_job_id(environ.get("SLURM_JOB_ID", "0")))
        return _validate(DistEnv(
            rank=_int(environ, "SLURM_PROCID"),
            local_rank=_int(environ, "SLURM_LOCALID", 0),
            world_size=_int(environ, "SLURM_NTASKS", 1),
            local_world_size=local_world,
            node_rank=node_rank,
            num_nodes=num_nodes,
            master_addr=master_addr,
            master_port=port,
            source="slurm",
            **common,
        ))

    if environ.get("SUBMITIT_EXECUTOR") == "local" and "SUBMITIT_LOCAL_GLOBALID" in environ:
        world = _int(environ, "SUBMITIT_LOCAL_NTASKS")
        num_nodes = _int(environ, "SUBMITIT_LOCAL_JOB_NUM_NODES", 1)
        port = (_int(environ, "MASTER_PORT") if environ.get("MASTER_PORT")
                else port_from_job_id(environ.get("SUBMITIT_LOCAL_JOB_ID", "0")))
        return _validate(DistEnv(
            rank=_int(environ, "SUBMITIT_LOCAL_GLOBALID"),
            local_rank=_int(environ, "SUBMITIT_LOCAL_LOCALID", 0),
            world_size=world,
            local_world_size=world // num_nodes,
            node_rank=_int(environ, "SUBMITIT_LOCAL_NODEID", 0),
            num_nodes=num_nodes,
            master_addr=master_addr or "127.0.0.1",
            master_port=port,
            source="submitit-local",
            **common,
        ))

    return DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, num_nodes=1,
                   master_addr=master_addr or "127.0.0.1", master_port=_int(environ, "MASTER_PORT", 29500),
                   source="single", **common)


LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launcher_vars(env: DistEnv) -> dict[str, str]:
    """``env`` as the torchrun-style variables a library launched "externally" reads.

    vLLM's ``distributed_executor_backend="external_launcher"`` takes its rank from ``os.environ["RANK"]`` and
    ``os.environ["LOCAL_RANK"]`` and initialises with ``env://`` (``MASTER_ADDR``/``MASTER_PORT``):
    ``ExecutorWithExternalLauncher._distributed_args`` in vllm/v1/executor/uniproc_executor.py (read at vLLM commit
    01e4fce, the 0.3x layout; the V0 executor of 0.10 reads ``RANK`` the same way). Under ``srun`` only the
    ``SLURM_*`` variables exist, so the engine would die with ``KeyError: 'RANK'``.

    vLLM selects ``cuda:<LOCAL_RANK>`` (its worker's and its groups' device), so ``LOCAL_RANK`` is the rank's
    device index (:attr:`DistEnv.device_index`): the local rank itself when the task sees the node's GPUs, 0 when
    Slurm gave the task a single GPU, where ``cuda:<local rank>`` would not exist.
    """
    return {"RANK": str(env.rank), "LOCAL_RANK": str(env.device_index), "WORLD_SIZE": str(env.world_size),
            "LOCAL_WORLD_SIZE": str(env.local_world_size), "MASTER_ADDR": env.master_addr,
            "MASTER_PORT": str(env.master_port)}


def export_launcher_vars(env: DistEnv, environ: Any = None) -> dict[str, str]:
    """Write :func:`launcher_vars` into ``environ`` (``os.environ`` by default) and return them. A value already
    there that disagrees is an error: two launchers describing different jobs must not be papered over. A
    ``LOCAL_RANK`` that a launcher set to this rank's local rank is replaced by its device index."""
    target = os.environ if environ is None else environ
    wanted = launcher_vars(env)
    for key, value in wanted.items():
        old = target.get(key)
        agrees = (value, str(env.local_rank)) if key == "LOCAL_RANK" else (value,)
        if old not in (None, "", *agrees) and key not in ("MASTER_ADDR", "MASTER_PORT"):
            raise ConfigError(f"the environment says {key}={old} but this process is {key}={value} "
                              f"({env.source} variables)", key=key)
        target[key] = value
    return wanted


@attrs.frozen
class RolloutGroups:
    """Where a rank sits in the rollout's tensor-parallel layout.

    vLLM builds its tensor-parallel groups from *consecutive* ranks (``initialize_model_parallel`` reshapes
    ``arange(world_size)`` with the TP size as the innermost dimension, vllm/distributed/parallel_state.py), so
    ranks ``[k*tp, (k+1)*tp)`` form one engine. Every rank of a group must submit the same prompts with the same
    seeds; different groups (``dp_rank``) generate for different prompts.
    """

    tp_size: int
    dp_size: int
    dp_rank: int
    tp_rank: int

    @property
    def is_tp_leader(self) -> bool:
        """The first rank of its group: the one whose copy of a group-wide result counts."""
        return self.tp_rank == 0


def rollout_groups(rank: int, world_size: int, tp_size: int) -> RolloutGroups:
    """:class:`RolloutGroups` of ``rank``; ``tp_size`` must divide ``world_size``.

    >>> rollout_groups(5, 8, 2)
    RolloutGroups(tp_size=2, dp_size=4, dp_rank=2, tp_rank=1)
    """
    if tp_size < 1 or world_size % tp_size:
        raise ConfigError(f"tensor_parallel_size {tp_size} does not divide the world size {world_size}",
                          key="rollout.tensor_parallel_size")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside world size {world_size}")
    return RolloutGroups(tp_size=tp_size, dp_size=world_size // tp_size, dp_rank=rank // tp_size,
                         tp_rank=rank % tp_size)


def init_distributed(env: DistEnv, *, timeout_s: float = 1800) -> None:
    """Join the default process group described by ``env`` (idempotent: a second call is a no-op).

    CPU uses gloo; CUDA selects ``cuda:<device_index>`` first (the local rank, or 0 in a task given one GPU) and
    uses NCCL, bound to that device.
    ``timeout_s`` bounds every collective: a rank that never arrives fails the others instead of hanging them.
    A world of one still gets a process group, so the same code paths (DTensor, DCP) run everywhere.
    """
    if dist.is_initialized():
        if dist.get_world_size() != env.world_size or dist.get_rank() != env.rank:
            raise RuntimeError(f"a process group already exists as rank {dist.get_rank()}/{dist.get_world_size()},"
                               f" not {env.rank}/{env.world_size}")
        return
    host = f"[{env.master_addr}]" if ":" in env.master_addr else env.master_addr
    kwargs: dict[str, Any] = {}
    if env.device_type == "cuda":
        torch.cuda.set_device(env.device_index)
        kwargs["device_id"] = torch.device("cuda", env.device_index)
    dist.init_process_group(
        backend=env.backend,
        init_method=f"tcp://{host}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        **kwargs,
    )


def destroy_distributed(*, sync_timeout_s: float | None = None) -> None:
    """Leave the default process group if there is one (safe to call twice).

    With ``sync_timeout_s`` the ranks first meet in a barrier bounded by that many seconds, so no rank tears its
    connections down while a peer still uses them (gloo can abort a peer that is mid-teardown; rank 0 also hosts
    the rendezvous store). A rank that never arrives only costs the timeout: the barrier's failure is swallowed,
    since leaving is all that is left to do.
    """
    if not dist.is_initialized():
        return
    if sync_timeout_s is not None and dist.get_world_size() > 1:
        try:
            work = dist.barrier(async_op=True)
            work.wait(timeout=datetime.timedelta(seconds=sync_timeout_s))
        except Exception:  # noqa: BLE001 - a peer died or timed out; leave anyway
            pass
    dist.destroy_process_group()


def get_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def get_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def collective_device() -> torch.device:
    """Where host numbers travel for a collective on the default group.

    torch binds each backend to device types: ``nccl`` moves only CUDA tensors (a CPU tensor fails with "No
    backend type associated with device type cpu"), gloo CPU tensors. NCCL groups are created bound to
    ``cuda:<device_index>`` (``init_distributed``), which is the current device. A group with a CPU backend
    (gloo, or ``cpu:gloo,cuda:nccl``) keeps host numbers on the CPU.
    """
    if not dist.is_initialized():
        return torch.device("cpu")
    # The device types the group has a backend for: ["cuda"] for "nccl" or "cuda:gloo", ["cpu", "cuda"] for
    # "cpu:gloo,cuda:nccl" (torch/distributed/distributed_c10d.py, _device_capability, torch 2.13). Host numbers
    # stay on the CPU wherever the group can move them from there.
    capability = set(dist.distributed_c10d._device_capability())
    if "cpu" in capability or not capability:
        return torch.device("cpu")
    if "cuda" in capability:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cuda")
    return torch.device(sorted(capability)[0])


_REDUCE_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN"}


def all_reduce_host(values: Sequence[float], op: str = "sum", *, force_collective: bool = False) -> list[float]:
    """Reduce a few Python numbers over all ranks in one collective; ``op`` is ``sum``, ``mean``, ``max`` or ``min``.

    The one way hpcppo reduces host numbers (flags, metric sums, counts): float64 on :func:`collective_device`,
    so every backend accepts it and integers up to 2**53 stay exact. Without a process group (or alone) the
    values come back unchanged. ``force_collective`` runs the collective on a 1-rank group too, so that a check on
    one GPU (tools/gpu_check.sh) takes the multi-rank path: device choice, NCCL all-reduce, copy back.
    """
    if op not in _REDUCE_OPS:
        raise ValueError(f"unknown reduction {op!r}; allowed: {sorted(_REDUCE_OPS)}")
    out = [float(v) for v in values]
    if not out or not dist.is_initialized() or (dist.get_world_size() == 1 and not force_collective):
        return out
    t = torch.tensor(out, dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=getattr(dist.ReduceOp, _REDUCE_OPS[op]))
    if op == "mean":
        t /= dist.get_world_size()
    return t.tolist()


def all_reduce_scalar(value: float, op: str = "mean") -> float:
    """:func:`all_reduce_host` of one number."""
    return all_reduce_host([value], op)[0]


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (pickled; keep it small)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (pickled; keep it small)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
