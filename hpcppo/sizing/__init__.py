"""``hpcppo plan``: per-GPU memory budget and time estimate of a run before it queues (no torch import).

:func:`estimate` (hpcppo.planning.estimate) computes a :class:`Budget` from the compiled site, experiment and
``RunPlan``; :func:`check_colocation` is what ``compile`` runs: it refuses a colocation that cannot fit and logs the
warnings; :mod:`hpcppo.planning.report` renders a budget as a rich table or JSON. The facts used (GPU kinds, known
model shapes, efficiency assumptions) live in :mod:`hpcppo.planning.catalog`, each with its source.
"""

from __future__ import annotations

import logging

from typing import TYPE_CHECKING, Any

# Only the catalog here: the site schema imports it, and hpcppo.planning.estimate imports the config package.
from hpcppo.planning.catalog import GPU_KINDS, GPUS, KNOWN_MODELS, ModelShape

if TYPE_CHECKING:
    from hpcppo.planning.estimate import Budget

__all__ = ["check_colocation", "GPU_KINDS", "GPUS", "KNOWN_MODELS", "ModelShape"]

log = logging.getLogger(__name__)


def check_colocation(site: Any, experiment: Any, plan: Any) -> Budget | None:
    """``ResolveError`` when the colocated job cannot fit one GPU of ``site`` (the first problem, with what to
    change); the warnings (KV cache waves, a ``signal_lead_s`` shorter than a step + checkpoint) are logged.
    CPU sites are not judged (``None``): their memory is the host's, which the planner does not model."""
    from hpcppo.errors import ResolveError
    from hpcppo.planning.estimate import estimate

    if site.device != "cuda":
        return None
    budget = estimate(site, experiment, plan)
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
