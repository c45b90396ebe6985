"""``Compiled`` (site, experiment, plan, provenance, job): what :mod:`hpcppo.compiler` makes of a site, a spec and
overrides; ``to_toml`` / ``load_resolved`` write and read ``resolved.toml``, the job's only input; the checks of the
model paths and the rollout engine; ``runs_root``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import attrs
import tomli_w

import hpcppo
from hpcppo import engines
from hpcppo.config.convert import converter, read_input, read_toml, structure
from hpcppo.config.experiment import Experiment
from hpcppo.config.fields import opt
from hpcppo.config.load import expand_path_text
from hpcppo.config.lora import check_adapter, check_lora_targets
from hpcppo.config.weights_check import check_weights
from hpcppo.config.plan import RunPlan
from hpcppo.config.resolve import resolve
from hpcppo.config.site import Site
from hpcppo.errors import ConfigError, PathError
from hpcppo.fsutil import atomic_write_text, path_length_problem
from hpcppo.rundir.record import runs_root_error

__all__ = ["Compiled", "JobSection", "check_experiment_paths", "check_engine_installed", "check_trackers_installed",
           "to_toml", "load_resolved", "write_resolved", "runs_root", "runs_root_origin", "RUNS_ROOT_ENV"]

_SECTIONS = ("source", "job", "site", "experiment", "plan", "provenance")


@attrs.frozen(kw_only=True)
class JobSection:
    """``[job]`` of resolved.toml: what the job entry point runs."""

    kind: str = opt("train", choices=("train", "preflight"), help="train, or preflight (a short check job).")
    collective_timeout_s: float = opt(1800.0, gt=0.0, help="torch.distributed timeout (trainer.collective_timeout_s).")
    preflight_paths: list[str] = opt(factory=list, help="Directories the preflight job checks it can write.")


@attrs.frozen(kw_only=True)
class Compiled:
    """Everything a run needs, resolved.

    ``provenance`` maps every leaf key to ``default``, ``site``, ``spec`` or ``override``; experiment keys
    are bare (``actor.lr``), site keys carry the ``site.`` prefix (``site.slurm.partition``).
    """

    site: Site
    experiment: Experiment
    plan: RunPlan
    provenance: dict[str, str]
    job: JobSection = attrs.field(factory=JobSection)
    spec_path: str = ""  # the spec file (absolute); "" for a generated spec (preflight)
    site_path: str = ""  # the site profile file (absolute)
    # The spec as given (what run directories keep as spec.toml); not part of resolved.toml.
    spec_text: str = attrs.field(default="", eq=False, repr=False)


_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def _model_config(key: str, path: str) -> dict[str, Any]:
    """The ``config.json`` of the Hugging Face model directory ``path`` (read as JSON: no torch, no transformers);
    ``PathError`` naming ``key`` when ``path`` is empty, missing, or a directory without a model config."""
    import json

    if not path:
        raise PathError(f"{key} is empty; allowed: a Hugging Face model directory (config.json, weights, tokenizer)")
    if not Path(path).is_dir():
        what = "does not exist" if not Path(path).exists() else "is not a directory"
        raise PathError(f"{key}: {path} {what} (a Hugging Face model directory is expected)")
    config = Path(path) / "config.json"
    try:
        data = json.loads(read_input(config))
    except FileNotFoundError:
        raise PathError(f"{key}: {path} holds no model (no config.json); allowed: a Hugging Face model directory "
                        f"(config.json, weights, tokenizer)") from None
    except (OSError, ValueError, ConfigError) as exc:
        raise PathError(f"{key}: {config} cannot be read as a model config: "
                        f"{getattr(exc, 'strerror', None) or exc}") from None
    if not isinstance(data, dict):
        raise PathError(f"{key}: {config} is not a model config (a JSON object is expected)")
    check_weights(key, path)  # the safetensors headers: random bytes fail here, not when the job loads them
    return data


def _positions(config: dict[str, Any]) -> tuple[str, int] | None:
    """The model's position limit and the config key that says it (a multimodal config nests it in text_config)."""
    for source in (config, config.get("text_config")):
        if isinstance(source, dict):
            for name in _POSITION_KEYS:
                value = source.get(name)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return name, value
    return None


def _refuse_vision_language(key: str, path: str, config: dict[str, Any]) -> None:
    """``ConfigError`` for a vision-language model (its config.json has a ``vision_config``, as Qwen2.5-VL's,
    Qwen3-VL's and GLM-4.1V's do): hpcppo feeds text prompts to a causal LM and would train it as text only."""
    if isinstance(config.get("vision_config"), dict):
        architectures = ", ".join(map(str, config.get("architectures") or [])) or "no architectures listed"
        raise ConfigError(f"{path} is a vision-language model (config.json has a vision_config; {architectures}); "
                          f"allowed: a text-only causal LM (hpcppo trains on text prompts)", key=key)


def check_experiment_paths(experiment: Experiment) -> None:
    """``PathError`` naming the key and path of the first model or data path that does not exist or holds no model;
    ``ConfigError`` when a prompt and its response do not fit the model's positions."""
    m, d = experiment.model, experiment.data
    config = _model_config("model.path", m.path)
    _refuse_vision_language("model.path", m.path, config)
    critic_config = _model_config("model.critic_path", m.critic_path) if m.critic_path else config
    if m.critic_path:
        _refuse_vision_language("model.critic_path", m.critic_path, critic_config)
    check_lora_targets("actor.lora", experiment.actor.lora, config, m.path)
    check_lora_targets("critic.lora", experiment.critic.lora, critic_config, m.critic_path or m.path)
    check_adapter("actor.lora.adapter_path", experiment.actor.lora, config)
    if m.tokenizer_path and not Path(m.tokenizer_path).is_dir():
        what = "does not exist" if not Path(m.tokenizer_path).exists() else "is not a directory"
        raise PathError(f"model.tokenizer_path: {m.tokenizer_path} {what} (a Hugging Face tokenizer directory is "
                        f"expected)")
    limit = _positions(config)
    total = d.max_prompt_length + d.max_response_length
    if limit is not None and total > limit[1]:
        raise ConfigError(f"{d.max_prompt_length} + data.max_response_length {d.max_response_length} = {total} "
                          f"positions, more than the model's {limit[0]} = {limit[1]} ({m.path}/config.json); "
                          f"allowed: a prompt and response of at most {limit[1]} together",
                          key="data.max_prompt_length")
    for key, values in (("data.train_files", d.train_files), ("data.val_files", d.val_files)):
        for i, value in enumerate(values):  # a file, or a directory of *.parquet (hpcppo.data.check looks inside)
            if not Path(value).exists():
                raise PathError(f"{key}[{i}]: {value} does not exist")


def check_trackers_installed(site: Site, experiment: Experiment) -> None:
    """``ConfigError`` when ``trainer.logger`` names a tracker whose package (``tensorboard``, ``wandb``: the
    ``trackers`` extra) is not installed in this interpreter and the job will run this very interpreter (as
    :func:`check_engine_installed` decides). Looked up with ``find_spec``: nothing is imported. Elsewhere the job
    checks before its first step."""
    if site.env.python or site.env.setup or site.container.runtime != "none":
        return
    missing = [n for n in experiment.trainer.logger if n != "console" and importlib.util.find_spec(n) is None]
    if missing:
        raise ConfigError(f"trainer.logger names {', '.join(missing)}, not installed in {sys.executable} (the Python "
                          f"site {site.name!r} runs the job with): pip install 'hpcppo[trackers]'",
                          key="trainer.logger")


def check_engine_installed(site: Site, experiment: Experiment) -> None:
    """``ConfigError`` when ``rollout.engine = "vllm"`` and the job will run this very interpreter (the site's
    ``env.python`` is "", no set-up commands, no container) but vLLM is not installed in it. Looked up with
    ``find_spec``: nothing is imported (vLLM imports torch)."""
    if (not engines.lookup(experiment.rollout.engine).needs_vllm or site.env.python or site.env.setup
            or site.container.runtime != "none"):
        return
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:  # (a directory named vllm on sys.path is a namespace package, not vLLM)
        raise ConfigError(f"vLLM is not installed in {sys.executable}, the Python site {site.name!r} runs the job "
                          f"with (env.python = \"\"); run tools/setup.sh --vllm and submit with .venv-vllm/bin/hpcppo, "
                          f"or use rollout.engine = \"hf\"", key="rollout.engine")


def _drop_none(value: Any) -> Any:
    # TOML has no null: unset optional fields are omitted and come back as their default (None).
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def to_toml(compiled: Compiled) -> str:
    """The text of ``resolved.toml``: a header comment, then ``[source]``, ``[job]``, ``[site]``,
    ``[experiment]``, ``[plan]`` and ``[provenance]``."""
    doc = {
        "source": {"hpcppo_version": hpcppo.__version__, "spec": compiled.spec_path, "site_file": compiled.site_path},
        "job": _drop_none(converter.unstructure(compiled.job)),
        "site": _drop_none(converter.unstructure(compiled.site)),
        "experiment": _drop_none(converter.unstructure(compiled.experiment)),
        "plan": _drop_none(converter.unstructure(compiled.plan)),
        "provenance": dict(compiled.provenance),
    }
    header = (
        f"# resolved.toml written by hpcppo {hpcppo.__version__}: the job's only input.\n"
        f"# Experiment {compiled.experiment.name!r} on site {compiled.site.name!r}: defaults < site < spec < "
        f"overrides, all applied; [plan] is derived (hpcppo.config.resolve). Do not edit: re-submit instead.\n\n"
    )
    return header + tomli_w.dumps(doc, multiline_strings=False)


def write_resolved(compiled: Compiled, path: str | os.PathLike[str]) -> Path:
    """Write ``resolved.toml`` atomically (temporary file, fsync, rename)."""
    return atomic_write_text(path, to_toml(compiled))


def load_resolved(path: str | os.PathLike[str]) -> Compiled:
    """Read a ``resolved.toml``; the plan is recomputed and must match the stored one."""
    label = str(path)
    data = read_toml(path)
    for key in data:
        if key not in _SECTIONS:
            raise ConfigError(f"unknown section; a resolved.toml has {', '.join(_SECTIONS)}", file=label, key=key)
    for key in _SECTIONS:
        if not isinstance(data.get(key), dict):
            raise ConfigError("missing section (is this a resolved.toml?)", file=label, key=key)
    source = data["source"]
    job = structure(data["job"], JobSection, file=label, path="job")
    site = structure(data["site"], Site, file=label, path="site")
    experiment = structure(data["experiment"], Experiment, file=label, path="experiment")
    plan = structure(data["plan"], RunPlan, file=label, path="plan")
    provenance = structure(data["provenance"], dict[str, str], file=label, path="provenance")
    fresh = resolve(site, experiment)
    if fresh != plan:
        diff = [f.name for f in attrs.fields(RunPlan) if getattr(fresh, f.name) != getattr(plan, f.name)]
        raise ConfigError(f"does not match the site and experiment (changed by hand, or written by another hpcppo "
                          f"version {source.get('hpcppo_version')!r}?); differing keys: {', '.join(diff)}",
                          file=label, key="plan")
    return Compiled(site=site, experiment=experiment, plan=plan, provenance=provenance, job=job,
                    spec_path=str(source.get("spec", "")), site_path=str(source.get("site_file", "")))


RUNS_ROOT_ENV = "HPCPPO_RUNS_ROOT"


def runs_root(site: Site, override: str | os.PathLike[str] | None = None, *, cwd: Path | None = None) -> Path:
    """The directory of run directories, as an absolute path. The one rule, used by compile, submit, preflight
    and every command that finds a run; the first that is set wins:

    1. ``override`` (the command line's ``--runs-root``);
    2. ``$HPCPPO_RUNS_ROOT``;
    3. the site's ``paths.runs_root``, whose default is ``runs``.

    ``~`` and ``$VAR`` are expanded (a variable that is not set is a ``ConfigError`` naming it and
    :func:`runs_root_origin`); a relative path is relative to ``cwd`` (default: the current directory);
    symbolic links are resolved.
    """
    raw = os.fspath(override) if override else (os.environ.get(RUNS_ROOT_ENV) or site.paths.runs_root)
    path = ((cwd or Path.cwd()) / Path(expand_path_text(raw, key=runs_root_origin(site, override)))).resolve()
    too_long = path_length_problem(path)  # before any stat: on such a path exists() raises ENAMETOOLONG
    if too_long:
        raise runs_root_error(path, runs_root_origin(site, override), too_long)
    if path.exists() and not path.is_dir():  # a file: "no runs" would be a lie, and compile would fail later
        raise runs_root_error(path, runs_root_origin(site, override), "exists and is not a directory")
    return path


def runs_root_origin(site: Site, override: str | os.PathLike[str] | None = None) -> str:
    """Which setting :func:`runs_root` takes its value from, as error messages name it."""
    if override:
        return "--runs-root"
    return f"${RUNS_ROOT_ENV}" if os.environ.get(RUNS_ROOT_ENV) else f"site.paths.runs_root (site {site.name!r})"
