"""The config compiler's two entry points: ``compile_config`` (site + spec + ``-o`` overrides -> ``Compiled``, with
the checks of the paths, the data, the reward and the memory) and ``compile_preflight`` (a generated spec for a
preflight job).

They sit above the packages whose checks they run: :mod:`hpcppo.config` (the schema, loading, ``resolve``),
:mod:`hpcppo.data.check` (the data and the reward) and :mod:`hpcppo.sizing` (compile's memory check), so that
none of those imports another's layer. No torch import (the login-node CLI compiles).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from pathlib import Path

import tomli_w

from hpcppo.agent.check import collect_specs, tool_classes, tool_problems
from hpcppo.agent.kwargs import TOOLS_KWARGS_KEY, tools_kwargs_problems
from hpcppo.agent.tool import ToolLoadError
from hpcppo.agent.tokenizer import TokenizerNotLoaded, load_tokenizer
from hpcppo.agent.tool_turns import MARKERS, ToolTurns, closing_marker_notes, format_problems
from hpcppo.config.attention import settle_attention
from hpcppo.config.compiled import (Compiled, JobSection, check_engine_installed, check_experiment_paths,
                                    check_trackers_installed, runs_root)
from hpcppo.config.convert import read_input
from hpcppo.config.idle import warn_idle_settings
from hpcppo.config.load import (expand_path_text, experiment_from_data, load_experiment_with_provenance,
                                load_site_with_provenance, parse_overrides)
from hpcppo.config.resolve import resolve
from hpcppo.config.experiment import DataSection, Experiment
from hpcppo.config.multi_turn import MultiTurnSection
from hpcppo.config.reward import check_reward_combination
from hpcppo.config.reward_check import check_reward_model
from hpcppo.config.rollout_corr import metric_columns as rollout_corr_columns
from hpcppo.config.watchdog import check_rule_metrics
from hpcppo.errors import ConfigError, SettingWarning
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
        _check_tools(experiment.rollout.multi_turn, str(spec_path), experiment.data)
        _check_tool_tokenizer(experiment, str(spec_path))
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


def _check_tools(section: MultiTurnSection, file: str, data: DataSection) -> None:
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
    if section.enable or specs:
        _check_tools_kwargs(data, tool_classes(specs))


def _check_tool_tokenizer(experiment: Experiment, file: str) -> None:
    """With ``rollout.multi_turn.enable``: the model's tokenizer can write the tool turns and the calls, the same
    checks as the job's when it builds the tool loop (hpcppo.agent.tool_turns), with the tokenizer loaded without
    torch (hpcppo.agent.tokenizer). One line naming the spec, the key and what is missing."""
    section, m = experiment.rollout.multi_turn, experiment.model
    if not section.enable:
        return
    key, directory = ("model.tokenizer_path", m.tokenizer_path) if m.tokenizer_path else ("model.path", m.path)
    try:
        tokenizer = load_tokenizer(directory)
    except TokenizerNotLoaded as exc:
        if exc.skipped:
            warnings.warn(f"{file}: rollout.multi_turn: {exc}", SettingWarning, stacklevel=2)
            return
        raise ConfigError(f"{exc}; the tool loop renders its tool turns with it", file=file, key=key) from None
    problems = format_problems(tokenizer, section.format)
    if problems:
        others = ", ".join(f for f in MARKERS if f != section.format)
        tiny = " (`hpcppo tools make-model --variant tool` builds the tiny one with them)" * (section.format == "compact")
        raise ConfigError(f"{problems[0]} ({directory}); allowed: a tokenizer that has them{tiny}, or format {others}",
                          file=file, key="rollout.multi_turn.format")
    try:
        ToolTurns(tokenizer, max_tool_response_length=section.max_tool_response_length,
                  truncate_side=section.tool_response_truncate_side)
    except ValueError as exc:
        raise ConfigError(f"{directory}: {exc}; allowed: a tokenizer whose chat template renders 'tool' messages",
                          file=file, key=key) from None
    for note in closing_marker_notes(tokenizer, section.format, section.max_parallel_calls):
        warnings.warn(f"{file}: rollout.multi_turn.max_parallel_calls: {note} ({directory})", SettingWarning,
                      stacklevel=2)


def _check_tools_kwargs(data: DataSection, tools: dict[str, type]) -> None:
    """Each row's ``extra_info.tools_kwargs`` names only configured tools and known phases, with arguments their
    methods take (hpcppo.agent.kwargs; ``tools``: the classes by name): the first problem, one line naming the
    file and the row."""
    from hpcppo.data.check import extra_info_values  # pyarrow: only when the data is checked

    for key, path, row, value in extra_info_values(data, TOOLS_KWARGS_KEY):
        problems = tools_kwargs_problems(value, tools, tools)
        if problems:
            raise ConfigError(f"row {row}: {problems[0]}", file=str(path), key=key)


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
