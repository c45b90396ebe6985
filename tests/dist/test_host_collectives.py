"""Host numbers are reduced through one helper whose device follows the group's backend.

An NCCL group moves CUDA tensors only: a CPU tensor fails with "No backend type associated with device type cpu".
On CPU, a group created as ``cuda:gloo`` has exactly that capability (gloo registered for the cuda device type
only), so 2 gloo ranks can show the failure and that ``collective_device`` picks CUDA for such a group, while a
``cpu:gloo,cuda:gloo`` group (the shape of vLLM's preferred ``cpu:gloo,cuda:nccl``) keeps host numbers on the CPU.
A static check makes sure hpcppo/train issues no collective of its own on host numbers.
"""

from __future__ import annotations

import ast
import datetime
from pathlib import Path

import torch
from _spawn import run_distributed

REPO = Path(__file__).resolve().parents[2]


def _worker(rank: int, world: int, init_file: str) -> dict:
    import torch.distributed as dist

    from hpcppo.distributed.env import all_reduce_host, collective_device

    out = {"gloo": str(collective_device()), "sum": all_reduce_host([rank + 1.0], "sum")}
    dist.destroy_process_group()
    for backend in ("cuda:gloo", "cpu:gloo,cuda:gloo"):
        dist.init_process_group(backend=backend, init_method=f"file://{init_file}-{backend.count(',')}",
                                rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
        out[backend] = {"device": collective_device().type}
        try:
            dist.all_reduce(torch.ones(1))
            out[backend]["cpu_all_reduce"] = "ok"
        except RuntimeError as exc:
            out[backend]["cpu_all_reduce"] = str(exc)
        if out[backend]["device"] == "cpu":
            out[backend]["sum"] = all_reduce_host([rank + 1.0], "sum")
        dist.destroy_process_group()
    # _spawn's teardown expects a default group
    dist.init_process_group(backend="gloo", init_method=f"file://{init_file}-last", rank=rank, world_size=world)
    return out


def test_collective_device_follows_the_group_backend(tmp_path):
    out = run_distributed(_worker, 2, str(tmp_path / "init"))
    for o in out:
        assert o["gloo"] == "cpu" and o["sum"] == [3.0]
        cuda_only = o["cuda:gloo"]
        assert "No backend type associated with device type cpu" in cuda_only["cpu_all_reduce"]  # as with NCCL
        assert cuda_only["device"] == "cuda"  # so host numbers would travel on the GPU, never fail on the CPU
        mixed = o["cpu:gloo,cuda:gloo"]
        assert mixed["device"] == "cpu" and mixed["cpu_all_reduce"] == "ok" and mixed["sum"] == [3.0]


# Direct collectives allowed in hpcppo/train: they move tensors that already live on the training device.
DEVICE_TENSOR_COLLECTIVES = {
    ("batching.py", "gather_rows"),  # the batch's [b, R] tensors, on the model's device
    ("batching.py", "global_batch_info"),  # counts computed from response_mask, on its device
    ("rollout_correction.py", "all_reduce_sum"),  # the bypass loss's IS weights, on the model's device
}
COLLECTIVES = {"all_reduce", "all_gather", "all_gather_object", "broadcast", "broadcast_object_list", "reduce",
               "reduce_scatter", "all_to_all", "gather", "scatter", "gather_object", "scatter_object_list"}


def test_trainer_host_collectives_go_through_the_helper():
    offenders = []
    for path in sorted((REPO / "hpcppo" / "train").glob("*.py")):
        if path.name == "preflight.py":  # the network check: its own tensors, on the device it probes
            continue
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in COLLECTIVES and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "dist" and (path.name, fn.name) not in DEVICE_TENSOR_COLLECTIVES):
                    offenders.append(f"{path.name}:{node.lineno} {fn.name}: dist.{node.func.attr}")
    assert not offenders, "use hpcppo.distributed.env.all_reduce_host / broadcast_object: " + ", ".join(offenders)
