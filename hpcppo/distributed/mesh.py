"""Device meshes for data parallelism: FSDP within a node, optionally replicated across nodes (HSDP)."""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from hpcppo.errors import ResolveError


def mesh_shape(world_size: int, num_nodes: int, *, hsdp: bool) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The mesh's shape and dimension names (pure; ``build_mesh`` uses it).

    One node, or ``hsdp=False``: ``((world_size,), ("shard",))`` — plain FSDP over every rank.
    Several nodes with ``hsdp``: ``((num_nodes, world_size // num_nodes), ("replicate", "shard"))`` — parameters
    are sharded within a node (fast links) and replicated across nodes, so only gradients cross the slow network.
    """
    if world_size < 1 or num_nodes < 1:
        raise ResolveError(f"world size ({world_size}) and node count ({num_nodes}) must be positive")
    if not hsdp or num_nodes == 1:
        return (world_size,), ("shard",)
    if world_size % num_nodes:
        raise ResolveError(f"HSDP needs the same number of ranks on every node: world size {world_size} is not a "
                           f"multiple of {num_nodes} nodes")
    return (num_nodes, world_size // num_nodes), ("replicate", "shard")


def build_mesh(device_type: str, world_size: int, num_nodes: int, *, hsdp: bool) -> DeviceMesh:
    """Build the data-parallel ``DeviceMesh`` over the default process group (which must exist).

    Ranks are laid out node-major (torchrun and ``srun`` number them so), so rows of the 2-D mesh are nodes.
    """
    shape, names = mesh_shape(world_size, num_nodes, hsdp=hsdp)
    return init_device_mesh(device_type, shape, mesh_dim_names=names)
