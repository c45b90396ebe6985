"""A rollout rank of a split run (``rollout.placement = "split"``, docs/placement.md): build the engine and what
feeds it, join the bridge, generate until trainer rank 0 says stop (:class:`hpcppo.rollout.worker.RolloutWorker`).

A rollout rank is not part of the trainers' torch.distributed world: it starts no default group of the job's.
An engine that needs a process group of its own (vLLM's external launcher) sees the world of its engine: one rank, or
with ``rollout.tensor_parallel_size = k`` the k consecutive rollout ranks of one node that form it
(:func:`hpcppo.rollout.split.engine_of`), on a port of its own (:func:`own_world`). The engine's ranks also share a
gloo group over that world (:class:`GlooEngineGroup`) through which the first one leads the others.
"""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path
from typing import Any

from hpcppo import estimators
from hpcppo.distributed.env import detect_env
from hpcppo.rollout.split import engine_of
from hpcppo.rollout.worker import RolloutWorker
from hpcppo.rundir import exitcodes
from hpcppo.train import rollout_phase
from hpcppo.train.build import build_rollout_parts

log = logging.getLogger("hpcppo.rollout")

OWN_PORT_OFFSET = 1  # an engine's own world listens on the bridge port + 1 + the engine's index


def own_world(environ: Any, index: int, tensor_parallel_size: int = 1) -> dict[str, str]:
    """The launcher variables of rollout rank ``index``'s engine world: its rank in the engine's group of
    ``tensor_parallel_size`` ranks (all on this host), on a port no other task uses: the bridge's + 1 + the engine's
    index (engines are numbered over the whole job, so two engines never share a port, and the range is the one a
    world of one rank per rollout rank used); ``LOCAL_RANK`` stays the task's, which picks its GPU."""
    engine, member = engine_of(index, tensor_parallel_size)
    port = int(environ["HPCPPO_BRIDGE_PORT"]) + OWN_PORT_OFFSET + engine
    return {"RANK": str(member), "WORLD_SIZE": str(tensor_parallel_size), "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


class GlooEngineGroup:
    """:class:`hpcppo.rollout.worker.EngineGroup` over the engine's torch.distributed world (the default group the
    engine started: vLLM's external launcher initializes it from :func:`own_world`'s variables): a gloo group of its
    own, so commands travel on the host whatever the engine's backend; a wait ends after ``timeout_s``."""

    def __init__(self, timeout_s: float):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("a tensor-parallel rollout engine started no torch.distributed world")
        self._dist = dist
        self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))

    def share(self, obj: Any) -> Any:
        box = [obj]
        self._dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]


def run_rollout_rank(compiled: Any, run_dir: Path, *, device_type: str, preempt: Any = None) -> int:
    """Generate for the trainers until told to stop; the exit code (the trainers' rank 0 records the run's)."""
    index = int(os.environ["HPCPPO_ROLLOUT_INDEX"])
    cfg, plan = compiled.experiment, compiled.plan
    tp = plan.tensor_parallel_size
    engine, member = engine_of(index, tp)
    os.environ.update(own_world(os.environ, index, tp))
    env = detect_env(device_type=device_type)  # type: ignore[arg-type]  # RunPlan.device's values
    timeout = float(cfg.trainer.collective_timeout_s)
    parts = build_rollout_parts(compiled, env)
    bridge = None
    try:
        bridge = rollout_phase.bridge_from_env(1 + index, backend=plan.backend, timeout_s=timeout)
        worker = RolloutWorker(
            bridge, engine=parts.engine, loop=rollout_phase.agent_loop(parts), prompt_at=parts.train_data.__getitem__,
            sampler=parts.sampler, sampling=parts.sampling, seed=cfg.seed, index=engine,
            rollout_ranks=plan.rollout_ranks // tp, dp_size=plan.train_dp_size,
            max_staleness=cfg.rollout.max_staleness, total_steps=parts.total_steps,
            greedy_baseline=estimators.needs_greedy_baseline(cfg.algorithm.adv_estimator),
            notice_timeout_s=timeout, group=GlooEngineGroup(timeout) if tp > 1 else None, member=member,
            val_prompt_at=parts.val_data.__getitem__ if parts.val_data is not None else None,
            val_sampling=parts.val_sampling)
        log.info("rollout rank %d of %d: %s engine %d (tensor-parallel rank %d of %d), generating for %d trainer "
                 "rank(s), up to %d step(s) ahead", index, plan.rollout_ranks, cfg.rollout.engine, engine, member, tp,
                 plan.train_dp_size, cfg.rollout.max_staleness)
        sent = worker.run()
        log.info("rollout rank %d: stopped after %d unit(s)", index, sent)
        return exitcodes.DONE
    finally:
        try:
            if bridge is not None:
                bridge.close()
        finally:
            parts.close()
