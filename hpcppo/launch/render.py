"""Pure rendering: a compiled run (site + experiment + plan) -> the job script text.

Jinja with ``StrictUndefined`` (a missing variable is an error, never an empty string) and shell
quoting filters applied to every user value (``q``, ``qenv``, ``sbatch_value``); ``#SBATCH``
directives are sorted and sit at the top. A site can point at its own template directory; the
packaged ``templates/`` are the fallback for partials it does not override.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from hpcppo import __version__, jobenv
from hpcppo.placement import placement_of
from hpcppo.errors import ConfigError
from hpcppo.launch.shell import is_env_name, quote, quote_command, quote_env
from hpcppo.resources import templates_dir
from hpcppo.rundir import RunPaths, exitcodes
from hpcppo.rundir.paths import rank_log_name

if TYPE_CHECKING:  # annotations only: rendering needs no config code at run time
    from hpcppo.config import Experiment, RunPlan, Site

SLURM_TEMPLATE = "slurm.sbatch.j2"
LOCAL_TEMPLATE = "local.sh.j2"
ENTRY_MODULE = "hpcppo.train.main"
WATCHDOG_MODULE = "hpcppo.watchdog"

_MEM_RE = re.compile(r"^(\d+)([KMGT]?)B?$", re.IGNORECASE)
_MEM_UNIT_MB = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def _sbatch_value(value: object) -> str:
    """Directive values: sbatch parses these lines itself, not a shell; refuse what could break them."""
    text = str(value)
    if any(c in text for c in "\n\r\0"):
        raise ConfigError(f"sbatch directive value {text!r} contains a line break")
    if re.fullmatch(r"[A-Za-z0-9_.,:@%/=+-]*", text):
        return text
    return quote(text)


def _mem_mb(spec: str) -> int:
    m = _MEM_RE.match(spec.strip())
    if not m:
        raise ConfigError(f"memory {spec!r} is not like 120G, 64000M or 512000", key="site.slurm.mem_per_task")
    return max(1, int(int(m.group(1)) * _MEM_UNIT_MB[m.group(2).upper()]))


def build_environment(templates: Sequence[Path]) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(p) for p in templates]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = quote
    env.filters["qenv"] = quote_env
    env.filters["sbatch_value"] = _sbatch_value
    return env


def template_dirs(site: Site) -> list[Path]:
    dirs = []
    custom = site.templates.dir
    if custom:
        path = Path(custom).expanduser()
        if not path.is_dir():
            raise ConfigError(f"template directory {path} does not exist", key="site.templates.dir")
        dirs.append(path)
    dirs.append(templates_dir())
    return dirs


def slurm_directives(site: Site, exp: Experiment, plan: RunPlan, run_dir: Path) -> list[tuple[str, str | None]]:
    """All ``#SBATCH`` directives as sorted (key, value) pairs; value None is a bare flag."""
    s = site.slurm
    d: dict[str, str | None] = {
        "job-name": exp.name,
        "nodes": str(plan.nodes),
        "ntasks-per-node": str(plan.ranks_per_node),
        "time": plan.time_limit,  # formatted once, by config.resolve
        "output": str(RunPaths(run_dir).batch_log("%j")),
        "open-mode": "append",  # a requeued attempt appends to the same batch log
        "chdir": str(run_dir),
        "signal": f"USR2@{s.signal_lead_s}",
    }
    if plan.gpus_per_node:  # also with site.slurm.compute_device = "cpu": the GPU sites' request, CPU compute
        if s.gpu_request == "gres":
            d["gres"] = f"{s.gres_name}:{plan.ranks_per_node}"
        else:
            d["gpus-per-node"] = str(plan.ranks_per_node)
    if s.cpus_per_task:
        d["cpus-per-task"] = str(s.cpus_per_task)
    if s.mem_per_task:
        d["mem"] = f"{_mem_mb(s.mem_per_task) * plan.ranks_per_node}M"
    for key in ("partition", "account", "qos", "constraint", "reservation"):
        value = getattr(s, key)
        if value:
            d[key] = value
    if s.exclusive:
        d["exclusive"] = None
    d["requeue" if s.requeue else "no-requeue"] = None
    origin = {"job-name": "name", "chdir": "paths.runs_root", "output": "paths.runs_root"}
    origin |= {k: f"site.slurm.{k}" for k in ("partition", "account", "qos", "constraint", "reservation")}
    for key, value in s.extra_directives.items():
        key = key.lstrip("-")
        if not re.fullmatch(r"[a-z][a-z0-9-]*", key):
            raise ConfigError(f"extra directive {key!r} is not an sbatch long option", key="site.slurm.extra_directives")
        d[key] = value if value not in ("", None) else None
        origin[key] = f"site.slurm.extra_directives.{key}"
    for key, value in d.items():
        # sbatch reads one directive per line: a line break would end it and start an unchecked one.
        if value is not None and any(c in str(value) for c in "\n\r\0"):
            raise ConfigError(f"value {str(value)!r} for --{key} contains a line break or NUL; sbatch directives are "
                              "one line", key=origin.get(key, f"--{key}"))
    return sorted(d.items())


def _env_pairs(mapping: dict[str, str], key: str) -> list[tuple[str, str]]:
    for name in mapping:
        if not is_env_name(name):
            raise ConfigError(f"{name!r} is not a valid environment variable name", key=key)
    return sorted(mapping.items())


def socket_ifname_vars(site: Site) -> dict[str, str]:
    """``env.socket_ifname`` as NCCL's and gloo's variables (config.site.SOCKET_IFNAME_VARS): NCCL's bootstrap
    and gloo's groups (vLLM's KV-cache agreement, the async checkpoint group) then cross nodes on one interface."""
    value = site.env.socket_ifname
    return dict.fromkeys(("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"), value) if value else {}


def environment_block(site: Site) -> dict[str, Any]:
    env = site.env
    return {
        "module_purge": env.module_purge,
        "modules": list(env.modules),
        "setup": [quote_command(line) for line in env.setup],
        "vars": _env_pairs(dict(env.vars), "site.env.vars"),
        "nccl": _env_pairs(dict(env.nccl) | socket_ifname_vars(site), "site.env.nccl"),
        "threads": env.threads_per_rank,
    }


def job_command(site: Site, run_dir: Path, python: str | None = None) -> list[str]:
    """The job entry point with the run directory as its only argument (unquoted words)."""
    return [python or site.env.python or "python3", "-u", "-m", ENTRY_MODULE, str(run_dir)]


def gpu_bind_args(site: Site, plan: RunPlan) -> list[str]:
    """srun's ``--gpu-bind`` for the trainers: ``site.slurm.gpu_bind`` when the job requests GPUs and the site sets
    one, else nothing (the site's binding).

    Nothing is the default because every binding works: a rank that sees its node's GPUs computes on
    ``cuda:<local rank>``, one that Slurm bound to a single GPU on ``cuda:0``
    (:func:`hpcppo.distributed.env.cuda_device_index`, which also gives vLLM its ``LOCAL_RANK``). ``none`` is not
    rendered unasked: with it Slurm 22.05 leaves ``CUDA_VISIBLE_DEVICES`` unset in the tasks (measured on the dev
    cluster), so on a shared node whose cgroups do not hide devices a rank would see other jobs' GPUs.
    """
    if not plan.gpus_per_node or not site.slurm.gpu_bind:
        return []
    return [f"--gpu-bind={_sbatch_value(site.slurm.gpu_bind)}"]


def _container_srun_args(site: Site, device: str = "cuda") -> tuple[list[str], list[str]]:
    """(extra srun options, command prefix) for the site's container runtime."""
    c = site.container
    if c.runtime == "pyxis":
        args = [f"--container-image={quote(c.image)}"]
        if c.mounts:
            args.append(f"--container-mounts={quote(','.join(c.mounts))}")
        if c.workdir:
            args.append(f"--container-workdir={quote(c.workdir)}")
        args += [quote(a) for a in c.extra_args]
        return args, []
    if c.runtime == "apptainer":
        # --nv binds the host's NVIDIA driver into the container; a CPU site has none to bind.
        prefix = ["apptainer", "exec"] + (["--nv"] if device == "cuda" else [])
        for mount in c.mounts:
            prefix += ["--bind", mount]
        if c.workdir:
            prefix += ["--pwd", c.workdir]
        prefix += list(c.extra_args) + [c.image]
        return [], prefix
    return [], []


def watchdog_available() -> bool:
    """The watchdog runner ships with hpcppo from the watchdog release on; before that the slot stays empty."""
    import importlib.util

    try:
        return importlib.util.find_spec("hpcppo.watchdog.__main__") is not None
    except ModuleNotFoundError:
        return False


def watchdog_command(site: Site, exp: Experiment, run_dir: Path, python: str | None = None,
                     prefix: Sequence[str] = ()) -> list[str]:
    """The monitor's command line (quoted words; the templates add ``--attempt "$HPCPPO_ATTEMPT"``), or ``[]``
    when ``watchdog.enable`` is false or this hpcppo has no runner. It runs in the container, like the trainers."""
    if not (exp.watchdog.enable and watchdog_available()):
        return []
    runner = [python or site.env.python or "python3", "-u", "-m", WATCHDOG_MODULE, str(run_dir)]
    return [quote(w) for w in [*prefix, *runner]]


def monitor_command(site: Site, exp: Experiment, run_dir: Path, python: str | None, prefix: Sequence[str]) -> list[str]:
    """The batch script's monitor: with ``site.container.monitor_python`` on the batch host, outside the container
    (there it reaches ``scancel`` and the ``srun`` process, :meth:`hpcppo.watchdog.monitor.Monitor.stop_slurm_steps`);
    else as the ranks run (apptainer: in ``apptainer exec``). A pyxis site without one is refused by compile
    (``config.resolve``) and here, for a script rendered another way: srun's container options do not reach it."""
    c = site.container
    if c.monitor_python and c.runtime != "none":
        return watchdog_command(site, exp, run_dir, c.monitor_python)
    if c.runtime == "pyxis" and exp.watchdog.enable:
        raise ConfigError("a pyxis site's watchdog monitor needs a Python with hpcppo on the batch host",
                          key="site.container.monitor_python")
    return watchdog_command(site, exp, run_dir, python, prefix)


def render_slurm(site: Site, exp: Experiment, plan: RunPlan, run_dir: Path, *, python: str | None = None) -> str:
    run_dir = Path(run_dir)
    container_args, prefix = _container_srun_args(site, plan.device)
    srun_args = [
        f"--nodes={plan.nodes}",
        f"--ntasks-per-node={plan.ranks_per_node}",
        "--kill-on-bad-exit=1",
        # one log per rank per attempt; the batch log keeps the launcher's own lines
        f'--output="$HPCPPO_LOG_DIR/{rank_log_name("%t")}"',
    ] + gpu_bind_args(site, plan) + container_args
    watchdog = monitor_command(site, exp, run_dir, python, prefix)
    ctx = _common_context(site, exp, plan, run_dir) | {
        "directives": slurm_directives(site, exp, plan, run_dir),
        "device": plan.device,
        "port_base": jobenv.PORT_BASE,
        "port_span": jobenv.PORT_SPAN,
        "bridge_offset": jobenv.PORT_SPAN // 2,  # jobenv.bridge_port's rule, for the port the script logs
        "srun_args": srun_args,
        "job_command": [quote(w) for w in prefix + job_command(site, run_dir, python)],
        "watchdog_command": watchdog,
        "watchdog_local": False,
        "watchdog_on_host": bool(site.container.monitor_python) and site.container.runtime != "none",
    }
    return _render(site, site.templates.name or SLURM_TEMPLATE, ctx)


def render_local(site: Site, exp: Experiment, plan: RunPlan, run_dir: Path, *, python: str | None = None) -> str:
    ctx = _common_context(site, exp, plan, run_dir) | {
        "job_command": [quote(w) for w in job_command(site, run_dir, python)],
        "watchdog_command": watchdog_command(site, exp, run_dir, python),
        "watchdog_local": True,
    }
    return _render(site, LOCAL_TEMPLATE, ctx)


def render(site: Site, exp: Experiment, plan: RunPlan, run_dir: Path, *, python: str | None = None) -> str:
    """Render the job script for the site's scheduler."""
    fn = render_slurm if site.scheduler == "slurm" else render_local
    return fn(site, exp, plan, run_dir, python=python)


def _common_context(site: Site, exp: Experiment, plan: RunPlan, run_dir: Path) -> dict[str, Any]:
    placement = placement_of(exp, plan)
    return {
        # split placement: one line saying which ranks train and which generate ("" colocated)
        "roles": placement.describe() if placement.split else "",
        "version": __version__,
        "run_id": Path(run_dir).name,
        "run_dir": str(run_dir),
        "site_name": site.name,
        "env": environment_block(site),
        "job_defaults": jobenv.job_defaults(deterministic=exp.trainer.deterministic),
        "hdf5_locking": site.hdf5.locking,
        "exit_codes": {"requeue": exitcodes.REQUEUE, "paused": exitcodes.PAUSED},
        # the run directory's files the script names, relative to $HPCPPO_RUN_DIR (hpcppo.rundir.paths)
        "run_files": RunPaths.shell("$HPCPPO_ATTEMPT"),
    }


def _render(site: Site, name: str, ctx: dict[str, Any]) -> str:
    env = build_environment(template_dirs(site))
    try:
        text = env.get_template(name).render(**ctx)
        return text if text.endswith("\n") else text + "\n"
    except jinja2.UndefinedError as exc:
        raise ConfigError(f"template {name}: {exc.message}", key="site.templates.dir") from None
    except jinja2.TemplateNotFound as exc:
        raise ConfigError(f"template {exc.name} not found in {[str(p) for p in template_dirs(site)]}") from None
