"""Compile's memory check: a run whose ranks (colocated, or split into trainer and rollout ranks) cannot fit one GPU of
the site is refused before it queues."""

from __future__ import annotations

import logging

from hpcppo.config.experiment import Experiment
from hpcppo.config.plan import RunPlan
from hpcppo.config.site import Site
from hpcppo.errors import ResolveError
from hpcppo.sizing.catalog import GPU_KINDS
from hpcppo.sizing.estimate import Budget, estimate

__all__ = ["check_colocation"]

log = logging.getLogger(__name__)


def check_colocation(site: Site, experiment: Experiment, plan: RunPlan) -> Budget | None:
    """``ResolveError`` when the colocated job cannot fit one GPU of ``site`` (the first problem, with what to
    change); the warnings (KV cache waves, a ``signal_lead_s`` shorter than a step + checkpoint) are logged.
    CPU sites are judged only on the host memory of their ranks while the models load (``site.slurm.mem_per_task``),
    and return ``None``."""
    budget = estimate(site, experiment, plan, compare=False)  # the memory check; plan compares placements
    if site.device != "cuda":  # only the host memory at start-up is judged (estimate._host_startup)
        if budget.problems:
            raise ResolveError(budget.problems[0])
        return None
    if budget.model is None:
        log.warning("hpcppo: warning: GPU memory not checked: %s", budget.model_note)
    elif budget.gpu is None:
        log.warning("hpcppo: warning: GPU memory not checked: site %r has no gpu key (allowed: %s)", site.name,
                    ", ".join(GPU_KINDS))
    if budget.problems:
        raise ResolveError(budget.problems[0])
    for warning in budget.warnings:
        log.warning("hpcppo: warning: %s", warning)
    return budget
