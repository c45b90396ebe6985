"""Typed configuration: site profiles, experiment specs, overrides with provenance, and the RunPlan.

Typical use::

    compiled = compile_config("examples/arith-tiny.toml", "local", ["actor.lr=2e-6"])  # hpcppo.compiler
    compiled.plan.world_size, compiled.provenance["actor.lr"]   # -> 2, "override"
    write_resolved(compiled, run_dir / "resolved.toml")           # the job reads it with load_resolved()

Precedence: schema defaults < the site's ``[defaults]`` table < the spec < ``-o`` overrides
(``-o site.slurm.partition=debug`` targets the site). Relative paths in a spec are relative to the
spec's directory. No torch import here or below: the login-node CLI uses this package.
"""

from __future__ import annotations

from hpcppo.config.compiled import (Compiled, JobSection, check_experiment_paths, load_resolved, runs_root,
                                    runs_root_origin, to_toml, write_resolved)
from hpcppo.config.experiment import (ActorSection, AlgorithmSection, CheckpointSection, CriticSection, DataSection,
                                      Experiment, FsdpSection, KlCtrlSection, ModelSection, ReferenceSection,
                                      ResourcesSection, RolloutSection, TrainerSection)
from hpcppo.config.explain import explain, provenance_rows, render_provenance
from hpcppo.config.fields import parse_slurm_time
from hpcppo.config.load import available_sites, load_experiment, load_site, parse_overrides, site_search_dirs
from hpcppo.config.plan import RunPlan
from hpcppo.config.resolve import format_slurm_time, resolve
from hpcppo.config.site import Site
from hpcppo.config.watchdog import Rule, WatchdogSection, default_rules

__all__ = [
    "Compiled", "JobSection", "check_experiment_paths", "load_resolved", "to_toml", "write_resolved", "runs_root",
    "runs_root_origin",
    "Experiment", "ModelSection", "DataSection", "RolloutSection", "FsdpSection", "ActorSection", "CriticSection",
    "ReferenceSection", "KlCtrlSection", "AlgorithmSection", "TrainerSection", "CheckpointSection",
    "ResourcesSection", "WatchdogSection", "Rule", "default_rules",
    "Site", "RunPlan", "resolve", "format_slurm_time", "parse_slurm_time",
    "load_site", "load_experiment", "parse_overrides", "available_sites", "site_search_dirs",
    "explain", "provenance_rows", "render_provenance",
]
