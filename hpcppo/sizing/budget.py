"""What an estimate is made of: items of memory, phases, the budget of a run, and the bytes of the dtypes involved."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from hpcppo.sizing.catalog import Constant, GpuSpec, ModelShape

__all__ = ["ADAM_BYTES", "MASTER_BYTES", "Budget", "Item", "Phase", "dtype_bytes"]

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
MASTER_BYTES = 4  # build.py loads every model in float32; FSDP's param_dtype is only the compute dtype
ADAM_BYTES = 8  # exp_avg + exp_avg_sq, float32 like the master weights


def dtype_bytes(name: str) -> int:
    return _DTYPE_BYTES[name]


@dataclass
class Item:
    """One block of GPU memory."""

    what: str
    bytes: int


@dataclass
class Phase:
    """What is on one GPU at the peak of one phase of a step."""

    name: str
    items: list[Item]

    @property
    def total(self) -> int:
        return sum(i.bytes for i in self.items)


@dataclass
class Budget:
    """The planner's result. ``problems`` are reasons the run cannot fit (``compile`` refuses on the first);
    ``warnings`` are worth reading but do not stop it."""

    model: ModelShape | None
    model_note: str
    gpu: GpuSpec | None
    world_size: int
    shard_size: int
    device: str = "cuda"
    phases: list[Phase] = field(default_factory=list)
    kv: dict[str, Any] = field(default_factory=dict)
    time: dict[str, float] = field(default_factory=dict)
    constants: list[Constant] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    host: dict[str, Any] = field(default_factory=dict)  # host memory per rank and node while the models load
    # the step time of this run's placement and of the best other one (hpcppo.sizing.steptime.compare_placements)
    placements: list[dict[str, Any]] = field(default_factory=list)
    placement_verdict: str = ""

    @property
    def peak(self) -> Phase | None:
        return max(self.phases, key=lambda p: p.total) if self.phases else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": asdict(self.model) | {"params": self.model.params, "active_params": self.model.active_params}
            if self.model else None,
            "model_note": self.model_note,
            "gpu": self.gpu.kind if self.gpu else None,
            "gpu_memory_bytes": self.gpu.memory_bytes if self.gpu else None,
            "world_size": self.world_size,
            "device": self.device,
            "shard_size": self.shard_size,
            "phases": [{"name": p.name, "total_bytes": p.total, "items": [asdict(i) for i in p.items]}
                       for p in self.phases],
            "peak_phase": self.peak.name if self.peak else None,
            "kv_cache": self.kv,
            "time": self.time,
            "constants": [asdict(c) for c in self.constants],
            "problems": self.problems,
            "warnings": self.warnings,
            "host_startup": self.host,
            "placements": self.placements,
            "placement_verdict": self.placement_verdict,
        }
