"""Which ranks of a job train and which generate: ``rollout.placement`` (docs/placement.md). No torch here: the
compiler checks the arithmetic with :func:`layout`, the launcher and the job read :func:`placement_of`, and every
task of a split job gets its role's environment from :func:`task_env` before torch.distributed starts.

One allocation, one ``srun``, every task started alike; a task's role follows from its global rank:

- ``resources.rollout_ranks_per_node = k``: on each node the last ``k`` local ranks generate, the others train (a
  trainer's local rank is then its Slurm local id, so its GPU is ``cuda:<local rank>`` as in a colocated job);
- ``resources.rollout_nodes = k``: the last ``k`` nodes generate, the first ones train.

A trainer's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE``/``GROUP_RANK`` are rewritten to the trainers'
world, so torch.distributed's default group (FSDP, the metrics reductions) holds trainers only. A rollout rank gets
``HPCPPO_ROLE=rollout`` and its index among the rollout ranks. Both get the bridge's address (trainer rank 0's host,
the job's first node) and port (:func:`hpcppo.jobenv.bridge_port`, distinct from ``MASTER_PORT``) and its size
(1 + the rollout ranks): the bridge joins trainer rank 0 and every rollout rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from hpcppo import jobenv
from hpcppo.errors import ConfigError, ResolveError

__all__ = ["PLACEMENTS", "Placement", "Role", "layout", "placement_of", "role_of", "task_env", "ROLE_VARS"]

PLACEMENTS = ("colocated", "split")
RoleKind = Literal["trainer", "rollout"]

# What task_env sets beside the trainer's torch.distributed variables (docs/placement.md lists them).
ROLE_VARS = ("HPCPPO_ROLE", "HPCPPO_GLOBAL_RANK", "HPCPPO_GLOBAL_WORLD_SIZE", "HPCPPO_ROLLOUT_INDEX",
             "HPCPPO_ROLLOUT_SIZE", "HPCPPO_BRIDGE_ADDR", "HPCPPO_BRIDGE_PORT", "HPCPPO_BRIDGE_SIZE")


@attrs.frozen(kw_only=True)
class Placement:
    """The roles of a job's ranks. Ranks are global (``SLURM_PROCID``): node ``i`` holds ranks
    ``i * ranks_per_node`` to ``(i + 1) * ranks_per_node - 1``. Colocated: every rank trains and generates
    (``rollout_ranks`` is empty)."""

    kind: str
    nodes: int
    ranks_per_node: int
    trainer_ranks: tuple[int, ...]
    rollout_ranks: tuple[int, ...]
    trainers_per_node: tuple[int, ...]
    """Trainer ranks on each node (0 on a rollout node)."""
    rollouts_per_node: tuple[int, ...]
    """Rollout ranks on each node."""

    @property
    def world_size(self) -> int:
        """Every task of the job (what srun starts)."""
        return self.nodes * self.ranks_per_node

    @property
    def split(self) -> bool:
        return self.kind == "split"

    @property
    def trainer_nodes(self) -> int:
        """Nodes that hold trainer ranks."""
        return sum(1 for t in self.trainers_per_node if t)

    @property
    def trainer_local_size(self) -> int:
        """Trainer ranks on each node that has any (the same on all of them)."""
        return max(self.trainers_per_node)

    def describe(self) -> str:
        """One line for the batch log and ``hpcppo plan``: which ranks do what."""
        if not self.split:
            return f"colocated: all {self.world_size} ranks train and generate"
        t, r = len(self.trainer_ranks), len(self.rollout_ranks)
        k = self.rollouts_per_node[0]
        if k:
            where = (f"local {_span('rank', self.ranks_per_node - k, self.ranks_per_node - 1)} of each node "
                     f"generate{'s' if k == 1 else ''}, {_span('rank', 0, self.ranks_per_node - k - 1)} "
                     f"train{'s' if self.ranks_per_node - k == 1 else ''}")
        else:
            first = self.trainer_nodes
            where = (f"{_span('node', first, self.nodes - 1)} generate{'s' if self.nodes - first == 1 else ''}, "
                     f"{_span('node', 0, first - 1)} train{'s' if first == 1 else ''}")
        return f"split: {t} trainer rank{'s' if t != 1 else ''}, {r} rollout rank{'s' if r != 1 else ''} ({where})"


def _span(what: str, first: int, last: int) -> str:
    return f"{what} {first}" if first == last else f"{what}s {first}-{last}"


@attrs.frozen
class Role:
    """A task's role and its index among the ranks of that role."""

    kind: RoleKind
    index: int


def layout(kind: str, nodes: int, ranks_per_node: int, *, rollout_ranks_per_node: int = 0,
           rollout_nodes: int = 0) -> Placement:
    """The placement of a job of ``nodes`` x ``ranks_per_node`` tasks; ``ResolveError`` naming the keys when the
    split leaves no trainer or no rollout rank, or names both ways (or neither) of splitting."""
    if kind not in PLACEMENTS:
        raise ResolveError(f"rollout.placement={kind!r}; allowed: {', '.join(map(repr, PLACEMENTS))}")
    per_node, whole = rollout_ranks_per_node, rollout_nodes
    if kind == "colocated":
        if per_node or whole:
            key = "resources.rollout_ranks_per_node" if per_node else "resources.rollout_nodes"
            raise ResolveError(f"{key}={per_node or whole} sets rollout ranks apart, which only rollout.placement = "
                               f"\"split\" does (colocated: every rank trains and generates); set "
                               f"rollout.placement = \"split\" or remove {key}")
        everyone = tuple(range(nodes * ranks_per_node))
        return Placement(kind=kind, nodes=nodes, ranks_per_node=ranks_per_node, trainer_ranks=everyone,
                         rollout_ranks=(), trainers_per_node=(ranks_per_node,) * nodes, rollouts_per_node=(0,) * nodes)
    if bool(per_node) == bool(whole):
        said = "both are set" if per_node else "neither is set"
        raise ResolveError(f"rollout.placement=\"split\" needs exactly one of resources.rollout_ranks_per_node (rollout "
                           f"ranks on every node) and resources.rollout_nodes (whole nodes of rollout ranks) > 0; "
                           f"{said}")
    if per_node:
        if per_node >= ranks_per_node:
            raise ResolveError(f"resources.rollout_ranks_per_node={per_node} leaves no trainer rank on a node of "
                               f"{ranks_per_node} ranks; allowed: 1 to {ranks_per_node - 1}"
                               if ranks_per_node > 1 else
                               f"resources.rollout_ranks_per_node={per_node}: a node of 1 rank cannot hold a trainer "
                               f"and a rollout rank; use more ranks per node (resources.procs_per_node or "
                               f"gpus_per_node) or resources.rollout_nodes on several nodes")
        rollouts = (per_node,) * nodes
    else:
        if whole >= nodes:
            raise ResolveError(f"resources.rollout_nodes={whole} leaves no trainer node in a job of {nodes} node"
                               f"{'s' if nodes != 1 else ''}; allowed: 1 to {nodes - 1}" if nodes > 1 else
                               f"resources.rollout_nodes={whole} needs at least 2 nodes (resources.nodes = {nodes}); "
                               f"on one node use resources.rollout_ranks_per_node")
        rollouts = (0,) * (nodes - whole) + (ranks_per_node,) * whole
    trainers: list[int] = []
    generators: list[int] = []
    for node, r in enumerate(rollouts):
        base, t = node * ranks_per_node, ranks_per_node - r
        trainers += range(base, base + t)
        generators += range(base + t, base + ranks_per_node)
    return Placement(kind=kind, nodes=nodes, ranks_per_node=ranks_per_node, trainer_ranks=tuple(trainers),
                     rollout_ranks=tuple(generators), trainers_per_node=tuple(ranks_per_node - r for r in rollouts),
                     rollouts_per_node=rollouts)


def placement_of(compiled: Any, plan: Any = None) -> Placement:
    """The placement of a compiled run (``hpcppo.config.Compiled``: its experiment's keys and its plan's layout), or
    of an experiment and its plan given apart (``placement_of(experiment, plan)``)."""
    exp, plan = (compiled, plan) if plan is not None else (compiled.experiment, compiled.plan)
    return layout(exp.rollout.placement, plan.nodes, plan.ranks_per_node,
                  rollout_ranks_per_node=exp.resources.rollout_ranks_per_node,
                  rollout_nodes=exp.resources.rollout_nodes)


def role_of(placement: Placement, global_rank: int) -> Role:
    """The role of the task of global rank ``global_rank``; ``ConfigError`` for a rank outside the job."""
    if not 0 <= global_rank < placement.world_size:
        raise ConfigError(f"rank {global_rank} is outside the job's {placement.world_size} ranks "
                          f"({placement.describe()})", key="RANK")
    if global_rank in placement.rollout_ranks:
        return Role("rollout", placement.rollout_ranks.index(global_rank))
    return Role("trainer", placement.trainer_ranks.index(global_rank))


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise ConfigError(f"{env[key]!r} is not an integer", key=key) from None


def _global_rank(env: Mapping[str, str]) -> tuple[int, str | None]:
    """(rank, the world-size variable beside the one it came from, when set) as hpcppo.distributed.env.detect_env
    reads launchers, in its order: torchrun-style RANK, srun's SLURM_PROCID, submitit's local ids, else 0."""
    for rank_key, world_key in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"),
                                ("SUBMITIT_LOCAL_GLOBALID", "SUBMITIT_LOCAL_NTASKS")):
        if env.get(rank_key, "") != "":
            return _int(env, rank_key), world_key if env.get(world_key) else None
    return 0, None


def task_env(placement: Placement, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with this task's role applied (a new dict; ``env`` is not changed). Colocated: ``env`` as it is.
    Applied once: an environment that already has ``HPCPPO_ROLE`` comes back as it is (the trainer's RANK is
    then already the trainers' own)."""
    out = dict(env)
    if not placement.split or env.get("HPCPPO_ROLE"):
        return out
    rank, world_key = _global_rank(env)
    if world_key is not None and _int(env, world_key) != placement.world_size:
        raise ConfigError(f"the job has {env[world_key]} tasks but the run was planned for {placement.world_size} "
                          f"({placement.describe()}); submit it as compiled", key=world_key)
    role = role_of(placement, rank)
    addr = env.get("MASTER_ADDR", "")
    if not addr:
        if placement.nodes > 1:
            raise ConfigError("is not set, and the bridge of a split job of several nodes listens on trainer rank 0's "
                              "host (the job script exports it)", key="MASTER_ADDR")
        addr = "127.0.0.1"
    master_port = _int(env, "MASTER_PORT") if env.get("MASTER_PORT") else jobenv.port_from_job_id(
        env.get("SLURM_JOB_ID") or env.get("SUBMITIT_LOCAL_JOB_ID") or "0")
    # the batch script exports the bridge port it logs (templates/partials/rendezvous.j2, the same rule)
    bridge = _int(env, "HPCPPO_BRIDGE_PORT") if env.get("HPCPPO_BRIDGE_PORT") else jobenv.bridge_port(master_port)
    out |= {"HPCPPO_ROLE": role.kind, "HPCPPO_GLOBAL_RANK": str(rank),
            "HPCPPO_GLOBAL_WORLD_SIZE": str(placement.world_size),
            "HPCPPO_ROLLOUT_SIZE": str(len(placement.rollout_ranks)),
            "HPCPPO_BRIDGE_ADDR": addr, "HPCPPO_BRIDGE_PORT": str(bridge),
            "HPCPPO_BRIDGE_SIZE": str(1 + len(placement.rollout_ranks))}
    if role.kind == "rollout":
        out["HPCPPO_ROLLOUT_INDEX"] = str(role.index)
        return out
    node = rank // placement.ranks_per_node
    out |= {"RANK": str(role.index), "WORLD_SIZE": str(len(placement.trainer_ranks)),
            "LOCAL_RANK": str(rank % placement.ranks_per_node),  # trainers hold a node's first local ranks
            "LOCAL_WORLD_SIZE": str(placement.trainers_per_node[node]), "GROUP_RANK": str(node),
            "MASTER_ADDR": addr, "MASTER_PORT": str(master_port)}
    return out
