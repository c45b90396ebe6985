"""Optimizers and learning-rate schedules from primitives (never a config object)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


def build_optimizer(model: nn.Module, *, lr: float, weight_decay: float, betas: Sequence[float]) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters. Build it after FSDP sharding (it must see the DTensors)."""
    params = [p for p in model.parameters() if p.requires_grad]
    # foreach: one multi-tensor kernel per step instead of one per parameter (also for FSDP2's DTensors).
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=tuple(betas), foreach=True)


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """Multiplier of the base lr after ``step`` optimizer steps: linear warm-up, then constant/cosine/linear decay."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant" or total_steps <= warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "cosine":
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    if schedule == "linear":
        return min_lr_ratio + (1 - min_lr_ratio) * (1 - progress)
    raise ValueError(f"unknown lr schedule {schedule!r}; known: constant, cosine, linear")


class LRSchedule:
    """A stateful schedule whose ``state_dict`` is plain ints/floats (checkpointable with ``weights_only``).

    ``scale`` multiplies the whole schedule: a rollback with ``lr_scale=0.5`` halves the lr from then on.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, base_lr: float, warmup_steps: int, total_steps: int,
                 schedule: str, min_lr_ratio: float):
        self.optimizer = optimizer
        self.base_lr = base_lr
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.schedule = schedule
        self.min_lr_ratio = min_lr_ratio
        self.steps = 0
        self.scale = 1.0
        lr_factor(0, warmup_steps=warmup_steps, total_steps=total_steps, schedule=schedule, min_lr_ratio=min_lr_ratio)
        self._apply()

    @property
    def lr(self) -> float:
        return self.base_lr * self.scale * lr_factor(self.steps, warmup_steps=self.warmup_steps, total_steps=self.total_steps,
                                                     schedule=self.schedule, min_lr_ratio=self.min_lr_ratio)

    def _apply(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr

    def step(self) -> None:
        self.steps += 1
        self._apply()

    def state_dict(self) -> dict[str, float | int]:
        return {"steps": self.steps, "scale": self.scale}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.steps = int(state["steps"])
        self.scale = float(state["scale"])
        self._apply()
