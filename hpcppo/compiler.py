"""The config compiler's two entry points: ``compile_config`` (site + spec + ``-o`` overrides -> ``Compiled``, with
the checks of the paths, the data, the reward and the memory) and ``compile_preflight`` (a generated spec for a
preflight job).

They sit above the packages whose checks they run: :mod:`hpcppo.config` (the schema, loading, ``resolve``),
:mod:`hpcppo.data.check` (the data and the reward) and :mod:`hpcppo.sizing` (compile's memory check), so that
none of those imports another's layer. No torch import (the login-node CLI compiles).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import tomli_w

from hpcppo.agent.check import collect_specs, tool_problems
from hpcppo.agent.tool import ToolLoadError
from hpcppo.config.attention import settle_attention
from hpcppo.config.compiled import (Compiled, JobSection, check_engine_installed, check_experiment_paths,
                                    check_trackers_installed, runs_root)
from hpcppo.config.convert import read_input
from hpcppo.config.idle import warn_idle_settings
from hpcppo.config.load import (expand_path_text, experiment_from_data, load_experiment_with_provenance,
                                load_site_with_provenance, parse_overrides)
from hpcppo.config.resolve import resolve
from hpcppo.config.multi_turn import MultiTurnSection
from hpcppo.config.reward import check_reward_combination
from hpcppo.config.reward_check import check_reward_model
from hpcppo.config.rollout_corr import metric_columns as rollout_corr_columns
from hpcppo.config.watchdog import check_rule_metrics
from hpcppo.errors import ConfigError
from hpcppo.sizing.check import check_colocation

__all__ = ["compile_config", "compile_preflight"]


def compile_config(spec: str | os.PathLike[str], site: str | os.PathLike[str] = "local",
                   overrides: Iterable[str] = (), *, check_paths: bool = True, cwd: Path | None = None,
                   check_memory: bool = True) -> Compiled:
    """Load the site (name or path) and the spec, apply ``-o key=value`` overrides, resolve the plan.

    ``check_paths=False`` skips the existence check of model and data paths (for ``config show`` on a
    login node where they exist only on the cluster); submission keeps it on. Relative paths in
    overrides are relative to ``cwd`` (default: the current directory). ``check_memory`` refuses a colocation
    that cannot fit a GPU of the site (hpcppo.sizing.check_colocation; ``hpcppo plan`` shows the budget).
    """
    spec_path = Path(spec)
    try:
        spec_text = read_input(spec_path).decode("utf-8")
    except (OSError, UnicodeDecodeError, ConfigError):
        spec_text = ""  # read_toml below reports the problem with the file name
    exp_data, site_data = parse_overrides(overrides)
    site_obj, site_prov, site_file = load_site_with_provenance(site, site_data)
    experiment, exp_prov = load_experiment_with_provenance(spec_path, exp_data, site=site_obj,
                                                           site_file=str(site_file), cwd=cwd)
    if check_paths:
        check_experiment_paths(experiment)
        # the family's attention implementations, from the installed transformers' source (no import)
        experiment = settle_attention(experiment, exp_prov)
        check_reward_model(experiment.reward_model, experiment.data)
        # pyarrow and numpy only when the data is checked: `config show`, `plan` and `compile --no-check-paths`
        # stay free of them (tests/unit/test_config_serialize.py).
        from hpcppo.data.check import check_experiment_data

        check_experiment_data(experiment)  # schema, data sources, reward_fn, prompt lengths, rows per batch
        check_engine_installed(site_obj, experiment)
        check_trackers_installed(site_obj, experiment)
        _check_tools(experiment.rollout.multi_turn, str(spec_path))
    check_rule_metrics(experiment.watchdog, file=str(spec_path),
                       extra=tuple(rollout_corr_columns(experiment.algorithm.rollout_correction)))
    check_reward_combination(experiment.reward_model, experiment.reward_manager, experiment.data.max_response_length,
                             file=str(spec_path))
    plan = resolve(site_obj, experiment)
    if check_memory:
        check_colocation(site_obj, experiment, plan)
    warn_idle_settings(experiment, exp_prov)  # after every refusal: a refused spec gets its one error line only
    job = JobSection(kind="train", collective_timeout_s=experiment.trainer.collective_timeout_s)
    return Compiled(site=site_obj, experiment=experiment, plan=plan, provenance=_merge_prov(exp_prov, site_prov),
                    job=job, spec_path=str(spec_path.resolve()), site_path=str(Path(site_file).resolve()),
                    spec_text=spec_text)


def _check_tools(section: MultiTurnSection, file: str) -> None:
    """The tools of [rollout.multi_turn] import and have valid schemas (no torch, no tool constructed). With the
    paths: a tool module, like a reward function's, may exist only where the job runs (`compile --no-check-paths`)."""
    try:
        specs = collect_specs([(t.class_name, t.config, t.tool_schema) for t in section.tools],
                              section.tool_config_path)
    except ToolLoadError as exc:
        raise ConfigError(str(exc), file=file, key="rollout.multi_turn.tool_config_path") from None
    problems = tool_problems(specs, section.format)
    if problems:
        key = "rollout.multi_turn.tools"
        raise ConfigError(f"\n{file}: {key}: ".join(problems), file=file, key=key)


def _merge_prov(exp_prov: dict[str, str], site_prov: dict[str, str]) -> dict[str, str]:
    provenance = dict(exp_prov)
    provenance.update({f"site.{k}": v for k, v in site_prov.items()})
    return provenance


def compile_preflight(site: str | os.PathLike[str] = "local", *, nodes: int | None = None,
                      overrides: Iterable[str] = (), cwd: Path | None = None,
                      runs_root_override: str | os.PathLike[str] | None = None) -> Compiled:
    """A preflight job for ``site``: the whole launch path, no model or data.

    The generated spec asks for ``nodes`` nodes (default: the site's largest allocation on Slurm, 1
    locally), all ranks per node, 10 minutes and a batch that divides any world size; ``overrides``
    apply as usual (e.g. ``resources.time=00:05:00``, ``site.slurm.partition=debug``). The job checks that it
    can write the runs root (:func:`runs_root` with ``runs_root_override``, the same rule the run directory
    follows) and the site's scratch directory.
    """
    exp_data, site_data = parse_overrides(overrides)
    site_obj, site_prov, site_file = load_site_with_provenance(site, site_data)
    n_nodes = nodes if nodes is not None else (site_obj.max_nodes if site_obj.scheduler == "slurm" else 1)
    # Ranks per node only depend on the site; the batch is then one prompt per rank.
    ranks = site_obj.gpus_per_node or (site_obj.local.procs_per_node if site_obj.scheduler == "local" else 1)
    world = max(1, n_nodes) * ranks
    data = {
        "name": "preflight",
        "description": f"preflight of site {site_obj.name}",
        "model": {"path": "unused-by-preflight"},
        "data": {"train_files": ["unused-by-preflight.parquet"]},
        "trainer": {"train_batch_size": world, "total_steps": 1},
        "actor": {"ppo_mini_batch_size": world, "ppo_micro_batch_size_per_gpu": 1},
        "resources": {"nodes": n_nodes, "time": "00:10:00"},
        "checkpoint": {"save_on_preempt": False},
        "watchdog": {"enable": False},
    }
    spec_text = "# generated by hpcppo preflight\n" + tomli_w.dumps(data)
    experiment, exp_prov = experiment_from_data(data, "preflight spec", None, exp_data, site=site_obj,
                                                site_file=str(site_file), cwd=cwd)
    plan = resolve(site_obj, experiment)
    paths = [str(runs_root(site_obj, runs_root_override, cwd=cwd))]
    if site_obj.paths.scratch:
        paths.append(expand_path_text(site_obj.paths.scratch, key="site.paths.scratch", label=str(site_file)))
    job = JobSection(kind="preflight", collective_timeout_s=min(300.0, experiment.trainer.collective_timeout_s),
                     preflight_paths=paths)
    return Compiled(site=site_obj, experiment=experiment, plan=plan, provenance=_merge_prov(exp_prov, site_prov),
                    job=job, spec_path="", site_path=str(Path(site_file).resolve()), spec_text=spec_text)
