"""Optimizers and learning-rate schedules from primitives (never a config object), and optimizer-state offload.

Offload (verl's ``optimizer_offload``): between updates the optimizer's per-parameter state (AdamW's ``exp_avg``
and ``exp_avg_sq``: two fp32 copies of the parameter shards, the largest block of training memory) lives in host
memory, so the accelerator's memory is free for rollout (a colocated vLLM's KV cache) and the forward passes.
Right before the update's first ``optimizer.step()`` it comes back to the parameters' devices, and after the
update's last step it goes back to the host. Parameters and gradients never move; the step runs on the device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor


def build_optimizer(model: nn.Module, *, lr: float, weight_decay: float, betas: Sequence[float]) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters. Build it after FSDP sharding (it must see the DTensors)."""
    params = [p for p in model.parameters() if p.requires_grad]
    # foreach: one multi-tensor kernel per step instead of one per parameter (also for FSDP2's DTensors).
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(float(betas[0]), float(betas[1])),
                             foreach=True)


def warmup_optimizer_steps(warmup_steps: int, warmup_ratio: float, total_steps: int,
                           optimizer_steps_per_step: int) -> int:
    """The warm-up in optimizer steps from the spec's, which counts training steps as verl does.

    verl steps its lr scheduler once per training step (fsdp_workers.py: ``actor_lr_scheduler.step()`` at the end of
    ``update_actor``, ``critic_lr_scheduler.step()`` in ``update_critic``) and, when lr_warmup_steps is negative,
    warms up for ``int(lr_warmup_steps_ratio * total_steps)`` of them (``_build_model_optimizer``,
    ``_build_critic_model_optimizer``). Here the lr moves at every optimizer step, so the same span of training
    steps is ``optimizer_steps_per_step`` times as many optimizer steps. 0 stays 0."""
    steps = warmup_steps if warmup_steps > 0 else int(warmup_ratio * total_steps)
    return steps * optimizer_steps_per_step


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

    def set_scale(self, scale: float) -> None:
        """Multiply the whole schedule by ``scale`` from now on (the watchdog's composed rollback factor)."""
        self.scale = float(scale)
        self._apply()

    def state_dict(self) -> dict[str, float | int]:
        return {"steps": self.steps, "scale": self.scale}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.steps = int(state["steps"])
        self.scale = float(state["scale"])
        self._apply()


# ---------------------------------------------------------------------------------------------- state offload
def _follows_param(group: dict[str, Any], key: str) -> bool:
    """Whether ``state[key]`` belongs on its parameter's device. AdamW keeps the scalar ``step`` on the CPU unless
    ``capturable`` or ``fused`` (a device scalar would cost a kernel launch and a sync per read); torch's own
    ``load_state_dict`` follows the same rule, so ``step`` never moves here either."""
    return key != "step" or bool(group.get("capturable") or group.get("fused"))


def _local(value: torch.Tensor) -> torch.Tensor:
    return value.to_local() if isinstance(value, DTensor) else value


def _copy_to(value: torch.Tensor, device: torch.device, *, pin: bool) -> torch.Tensor:
    """A copy of ``value`` in fresh memory on ``device``: same dtype, shape and strides, so bit-identical. A DTensor
    stays a DTensor on the same mesh with the same placements and global shape/stride (only its local shard
    moves; uneven shards keep their size). The copy is asynchronous where it can be (pinned host <-> device):
    the caller synchronises once after all copies."""
    if isinstance(value, DTensor):
        local = _copy_to(value.to_local(), device, pin=pin)
        return DTensor.from_local(local, value.device_mesh, value.placements, run_check=False, shape=value.shape,
                                  stride=value.stride())
    out = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=device, pin_memory=pin)
    out.copy_(value, non_blocking=True)
    return out


def _synchronize(devices: Iterable[torch.device]) -> None:
    # Non-blocking copies to pinned host memory are unreadable until their stream has run them.
    for device in devices:
        if device.type != "cpu":
            torch.get_device_module(device).synchronize(device)


def _move_state(optimizer: torch.optim.Optimizer, target_of: Callable[[torch.Tensor], torch.device],
                pin: bool | None) -> tuple[int, set[torch.device]]:
    """Replace every device-following state tensor by a copy on ``target_of(param)``; returns the bytes moved
    and the devices touched. Tensors are replaced one at a time, so the transient extra memory is one tensor."""
    moved, touched = 0, set()
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param)  # .get: the state is a defaultdict; do not create entries
            if not state:
                continue  # before the first step there is nothing to move (AdamW creates it on the device)
            target = target_of(param)
            for key, value in list(state.items()):
                if not isinstance(value, torch.Tensor) or not _follows_param(group, key):
                    continue
                source = _local(value).device
                use_pin = pin if pin is not None else (target.type == "cpu" and source.type == "cuda")
                state[key] = _copy_to(value, target, pin=use_pin)
                moved += _local(value).numel() * _local(value).element_size()
                touched |= {source, target}
    return moved, touched


@torch.no_grad()
def offload_optimizer_state(optimizer: torch.optim.Optimizer, device: str | torch.device = "cpu", *,
                            pin: bool | None = None, release_cache: bool = True) -> int:
    """Move ``optimizer``'s per-parameter state tensors into fresh memory on ``device`` (the host); returns the
    bytes moved (this rank's shards).

    ``pin``: page-locked host memory, which makes the copies asynchronous and the way back fast; ``None`` pins
    exactly when a tensor comes from a CUDA device (pinning needs one). Non-tensor state is left alone, and so is
    AdamW's scalar ``step`` unless the optimizer is ``capturable``/``fused``. DTensor states keep their mesh and
    placements. Returns after the copies are complete. ``release_cache`` hands the freed device blocks back to
    the driver (``empty_cache``): a colocated vLLM allocates outside PyTorch's caching allocator and would not
    see them otherwise. An optimizer with empty state (before its first step) is left as it is.

    Every call copies, also a tensor that is already on ``device``: call it once per trip (the trainer does so
    through :class:`OptimizerStateOffload`). Pinned blocks freed by :func:`load_optimizer_state` stay in PyTorch's
    host-memory cache, so later trips do not pay for page-locking again.
    """
    target = torch.device(device)
    if pin and target.type != "cpu":
        raise ValueError(f"pin=True needs a host target device, got {target}")
    moved, touched = _move_state(optimizer, lambda _param: target, pin)
    _synchronize(touched)
    if release_cache and any(d.type == "cuda" for d in touched):
        torch.cuda.empty_cache()
    return moved


@torch.no_grad()
def load_optimizer_state(optimizer: torch.optim.Optimizer, device: str | torch.device | None = None) -> int:
    """Inverse of :func:`offload_optimizer_state`: every state tensor that follows its parameter goes to that
    parameter's device (``device`` overrides), in fresh memory; returns the bytes moved. Returns after the
    copies are complete, so the next ``optimizer.step()`` may run on any stream."""
    fixed = None if device is None else torch.device(device)
    moved, touched = _move_state(optimizer, lambda param: fixed if fixed is not None else param.device, pin=False)
    _synchronize(touched)
    return moved


class OptimizerStateOffload:
    """One update's view of an offloaded optimizer state: :meth:`before_step` right before each
    ``optimizer.step()`` (the first call brings the state back, so the first mini-batch's forward/backward still
    runs with it on the host), :meth:`after_update` once after the update's last step (the state goes back to the
    host). Both are no-ops when not ``enabled``. Create one per update: it tracks only that update."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, enabled: bool):
        self.optimizer = optimizer
        self.enabled = enabled
        self.loaded = False

    def before_step(self) -> None:
        if self.enabled and not self.loaded:
            load_optimizer_state(self.optimizer)
            self.loaded = True

    def after_update(self) -> None:
        # Only after a load: an update that never stepped left the state where it was (on the host).
        if self.loaded:
            offload_optimizer_state(self.optimizer)
            self.loaded = False
