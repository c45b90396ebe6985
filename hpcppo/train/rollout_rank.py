"""A rollout rank of a split run (``rollout.placement = "split"``, docs/placement.md): build the engine and what
feeds it, join the bridge, generate until trainer rank 0 says stop (:class:`hpcppo.rollout.worker.RolloutWorker`).

A rollout rank is not part of the trainers' torch.distributed world: it starts no default group of the job's.
An engine that needs a process group of its own (vLLM's external launcher) sees a world of one, on a port of its own
(:func:`own_world`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from hpcppo import estimators
from hpcppo.distributed.env import detect_env
from hpcppo.rollout.worker import RolloutWorker
from hpcppo.rundir import exitcodes
from hpcppo.train import rollout_phase
from hpcppo.train.build import build_rollout_parts

log = logging.getLogger("hpcppo.rollout")

OWN_PORT_OFFSET = 1  # a rollout rank's own world listens on the bridge port + 1 + its index


def own_world(environ: Any, index: int) -> dict[str, str]:
    """The launcher variables of a one-process world for rollout rank ``index``: rank 0 of 1 on this host, on a
    port no other task uses (the bridge's + 1 + index); ``LOCAL_RANK`` stays the task's, which picks its GPU."""
    port = int(environ["HPCPPO_BRIDGE_PORT"]) + OWN_PORT_OFFSET + index
    return {"RANK": "0", "WORLD_SIZE": "1", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def run_rollout_rank(compiled: Any, run_dir: Path, *, device_type: str, preempt: Any = None) -> int:
    """Generate for the trainers until told to stop; the exit code (the trainers' rank 0 records the run's)."""
    index = int(os.environ["HPCPPO_ROLLOUT_INDEX"])
    os.environ.update(own_world(os.environ, index))
    env = detect_env(device_type=device_type)  # type: ignore[arg-type]  # RunPlan.device's values
    cfg, plan = compiled.experiment, compiled.plan
    timeout = float(cfg.trainer.collective_timeout_s)
    parts = build_rollout_parts(compiled, env)
    bridge = None
    try:
        bridge = rollout_phase.bridge_from_env(1 + index, backend=plan.backend, timeout_s=timeout)
        worker = RolloutWorker(
            bridge, engine=parts.engine, loop=rollout_phase.agent_loop(parts), prompt_at=parts.train_data.__getitem__,
            sampler=parts.sampler, sampling=parts.sampling, seed=cfg.seed, index=index,
            rollout_ranks=plan.rollout_ranks, dp_size=plan.train_dp_size, max_staleness=cfg.rollout.max_staleness,
            total_steps=parts.total_steps,
            greedy_baseline=estimators.needs_greedy_baseline(cfg.algorithm.adv_estimator),
            notice_timeout_s=timeout)
        log.info("rollout rank %d of %d: %s engine, generating for %d trainer rank(s), up to %d step(s) ahead",
                 index, plan.rollout_ranks, cfg.rollout.engine, plan.train_dp_size, cfg.rollout.max_staleness)
        sent = worker.run()
        log.info("rollout rank %d: stopped after %d unit(s)", index, sent)
        return exitcodes.DONE
    finally:
        try:
            if bridge is not None:
                bridge.close()
        finally:
            parts.close()
