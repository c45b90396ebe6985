"""Sizing a run before it queues (no torch import): the per-GPU memory budget and the time estimate behind
``hpcppo plan`` and compile's memory check.

Not to be confused with the two other plans: :class:`hpcppo.config.plan.RunPlan` (the derived numbers of a run,
``[plan]`` in ``resolved.toml``) and the split of a batch into mini- and micro-batches for one update (:mod:`hpcppo.train.update`).

:func:`~hpcppo.sizing.estimate.estimate` computes a :class:`~hpcppo.sizing.estimate.Budget` from the compiled site,
experiment and ``RunPlan``; :func:`~hpcppo.sizing.check.check_colocation` is what ``compile`` runs: it refuses a
colocation that cannot fit and logs the warnings; :mod:`hpcppo.sizing.report` renders a budget as a rich table or
JSON. The facts used (GPU kinds, known model shapes, efficiency assumptions) live in :mod:`hpcppo.sizing.catalog`,
each with its source; the catalog imports nothing of ours, because the site schema (:mod:`hpcppo.config.site`)
validates ``gpu`` against it, while the rest of the package sits above :mod:`hpcppo.config`. This ``__init__``
imports nothing, so that importing the catalog does not import the estimate.
"""
