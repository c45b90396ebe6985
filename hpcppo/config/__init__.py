"""Typed configuration: site profiles, experiment specs, overrides with provenance, and the RunPlan.

No torch import here or below: the login-node CLI uses this package.
"""

from __future__ import annotations

from hpcppo.config.experiment import Experiment
from hpcppo.config.plan import RunPlan
from hpcppo.config.site import Site
from hpcppo.config.watchdog import Rule, default_rules

__all__ = ["Experiment", "RunPlan", "Site", "Rule", "default_rules"]
