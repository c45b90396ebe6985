"""Site profile schema (``sites/<name>.toml``): scheduler, hardware, environment, container, paths.

A site describes a machine, not an experiment. Its optional ``[defaults]`` table holds *experiment*
keys the site wants for its hardware (e.g. ``model.dtype`` or ``actor.fsdp.param_offload``); they sit
between the built-in defaults and the experiment spec in precedence.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from hpcppo.config.fields import FieldValueError, opt, parse_slurm_time
from hpcppo.sizing.catalog import GPU_KINDS

__all__ = ["Site", "SlurmSection", "LocalSection", "EnvSection", "ContainerSection", "PathsSection",
           "Hdf5Section", "TemplatesSection"]

_MEM_RE = re.compile(r"^[1-9][0-9]*[KMGT]?$")
_DIRECTIVE_RE = re.compile(r"^[a-z][a-z0-9-]*$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MOUNT_RE = re.compile(r"^[^:\s]+:[^:\s]+(:(ro|rw))?$")
SOCKET_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")  # both rendered from env.socket_ifname


_TIME_ALLOWED = "Slurm time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def _check_time(value: str) -> str | None:
    try:
        parse_slurm_time(value)
    except ValueError as exc:
        return str(exc)
    return None


def _check_mem(value: str) -> str | None:
    if value == "" or _MEM_RE.match(value):
        return None
    return f"{value!r} is not a Slurm memory size (e.g. \"120G\", \"512000M\"; \"\" = omit)"


def _check_directives(value: dict[str, str]) -> str | None:
    reserved = {"nodes", "ntasks-per-node", "time", "job-name", "output", "error", "signal", "requeue",
                "partition", "account", "qos", "constraint", "reservation", "gpus-per-node", "gres",
                "cpus-per-task", "mem", "exclusive"}
    for key in value:
        if not _DIRECTIVE_RE.match(key):
            return f"{key!r} is not an sbatch option name (lower-case letters, digits and '-', without '--')"
        if key in reserved:
            return f"{key!r} is set by hpcppo from the site/experiment; use the dedicated key instead"
    return None


def _check_env(value: dict[str, str]) -> str | None:
    for key, text in value.items():
        if not _ENV_NAME_RE.match(key):
            return f"{key!r} is not a valid environment variable name"
        if "\x00" in text:  # no process environment can hold it: the job script would be cut there or refused
            return f"the value of {key} contains a NUL character; allowed: any text without NUL"
    return None


_IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*$")


def _check_ifname(value: str) -> str | None:
    if value == "" or _IFNAME_RE.match(value):
        return None
    return (f"{value!r} is not a list of interface names (e.g. \"ib0\" or \"eth0,eth1\"; \"\" = unset); NCCL's '^' "
            f"and '=' prefixes are not allowed because GLOO_SOCKET_IFNAME takes exact names only")


def _check_mounts(value: list[str]) -> str | None:
    for item in value:
        if not _MOUNT_RE.match(item):
            return f"{item!r} is not a mount (\"src:dst\" or \"src:dst:ro\")"
    return None


@attrs.frozen(kw_only=True)
class SlurmSection:
    """``[slurm]``: what the sbatch directives ask for."""

    partition: str = opt("", help="Slurm partition (--partition); \"\" = the cluster default.")
    account: str = opt("", help="Account to charge (--account); \"\" = omit.")
    qos: str = opt("", help="Quality of service (--qos); \"\" = omit.")
    constraint: str = opt("", help="Node feature constraint (--constraint), e.g. \"a100\"; \"\" = omit.")
    reservation: str = opt("", help="Reservation name (--reservation); \"\" = omit.")
    gpus_per_node: int = opt(0, ge=0, help="GPUs on each node; 0 = a CPU site (one gloo rank per process).")
    gpu_request: str = opt("gpus-per-node", choices=("gpus-per-node", "gres"),
                           help="How GPUs are requested: --gpus-per-node=N or --gres=<gres_name>:N.")
    gres_name: str = opt("gpu", pattern=r"[A-Za-z0-9_:.-]+",
                         help="GRES name when gpu_request = \"gres\" (e.g. \"gpu\" or \"gpu:h100\").")
    gpu_bind: str = opt(
        "", pattern=r"[A-Za-z0-9_:,.-]*",
        help="srun --gpu-bind for the trainers, rendered when GPUs are requested; \"\" = the site's binding. Ranks work "
             "either way: one that sees the node's GPUs takes cuda:<local rank>, one bound to a single GPU takes "
             "cuda:0. \"none\" also stops Slurm from setting CUDA_VISIBLE_DEVICES (Slurm 22.05), so use it only "
             "where cgroups hide other jobs' GPUs (ConstrainDevices=yes) or nodes are exclusive.")
    compute_device: str = opt(
        "auto", choices=("auto", "cpu"),
        help="What the ranks compute on: auto = CUDA with NCCL when gpus_per_node > 0, else CPU with gloo; cpu = CPU "
             "ranks over gloo although the job requests GPUs like a GPU site (a dev cluster whose GPUs are fake "
             "devices: the GPU sites' job shape and srun line, no GPU underneath).")
    cpus_per_task: int = opt(1, ge=1, help="CPU cores per rank (--cpus-per-task).")
    mem_per_task: str = opt("", check=_check_mem,
                            help="Memory per rank, Slurm size (e.g. \"120G\"); \"\" = the partition default.")
    max_nodes: int = opt(1, ge=1, help="Largest number of nodes one job may use on this site.")
    max_time: str = opt("48:00:00", check=_check_time, allowed=_TIME_ALLOWED,
                        help="Longest wall time the partition allows (Slurm format: D-HH:MM:SS, HH:MM:SS, MM:SS, minutes).")
    exclusive: bool = opt(False, help="Ask for whole nodes (--exclusive).")
    signal_lead_s: int = opt(300, ge=0,
                             help="Seconds before the time limit at which Slurm sends USR2 (--signal=USR2@N) so the job checkpoints.")
    requeue: bool = opt(True, help="Let Slurm requeue the job after preemption or a time-limit checkpoint (--requeue).")
    extra_directives: dict[str, str] = opt(
        factory=dict, check=_check_directives,
        help="Further sbatch options, name without '--' -> value, e.g. {\"mail-type\" = \"END\"}; values are shell-quoted.")


@attrs.frozen(kw_only=True)
class LocalSection:
    """``[local]``: submitit's LocalExecutor on this machine (scheduler = "local")."""

    procs_per_node: int = opt(2, ge=1, help="CPU ranks started on this machine when the site has no GPUs.")
    gpus_per_node: int = opt(0, ge=0, help="GPUs on this workstation; > 0 runs one CUDA rank per GPU.")
    max_time: str = opt("48:00:00", check=_check_time, allowed=_TIME_ALLOWED, help="Longest wall time a local run may ask for (Slurm time format).")


@attrs.frozen(kw_only=True)
class EnvSection:
    """``[env]``: the job's environment block."""

    modules: list[str] = opt(factory=list, help="Environment modules to load (module load ...), in order.")
    module_purge: bool = opt(False, help="Run 'module purge' before loading modules.")
    setup: list[str] = opt(
        factory=list,
        help="Setup commands run before the job, one command per line (e.g. 'source /opt/venvs/rl/bin/activate'): "
             "each word is shell-quoted and only ${NAME} expands, so no ';', pipes or $(...); put shell logic in "
             "a script and source it.")
    vars: dict[str, str] = opt(factory=dict, check=_check_env,
                               help="Environment variables exported in the job (values are shell-quoted).")
    nccl: dict[str, str] = opt(factory=dict, check=_check_env,
                               help="NCCL system variables (e.g. NCCL_IB_HCA), exported in the job; the interface is env.socket_ifname.")
    socket_ifname: str = opt(
        "", check=_check_ifname, allowed="\"\" or interface names separated by commas, e.g. \"ib0\" or \"eth0,eth1\"",
        help="Network interface(s) of the bootstrap sockets, comma-separated (e.g. \"ib0\"): exported as both "
             "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME (gloo carries vLLM's KV-cache agreement across the world and "
             "the async checkpoint group); plain names only, gloo knows no NCCL '^'/'=' prefixes; \"\" = each "
             "library picks its own.")
    python: str = opt("python3", help="Interpreter that runs the job entry point; \"\" = the one running hpcppo.")
    threads_per_rank: int = opt(0, ge=0, help="OMP_NUM_THREADS for each rank; 0 = leave it unset.")

    def __attrs_post_init__(self) -> None:
        for key, table in (("nccl", self.nccl), ("vars", self.vars)):
            for name in SOCKET_IFNAME_VARS:
                if name in table:  # one holder: the two libraries must agree on the interface
                    raise FieldValueError(key, f"{name} is set by env.socket_ifname (it renders both "
                                               f"{' and '.join(SOCKET_IFNAME_VARS)}); move the value there")


# apptainer exec's options that start from an empty environment: --cleanenv (-e) and --containall (-C), which
# implies it (apptainer-exec(1)); short booleans may be grouped (-eC), and a bool flag may be spelt --cleanenv=true.
_CLEANENV_LONG = ("--cleanenv", "--containall")
_SHORT_GROUP_RE = re.compile(r"^-[A-Za-z]+$")


def _cleans_environment(arg: str) -> bool:
    name, _, value = arg.partition("=")
    if name in _CLEANENV_LONG:
        return value.lower() not in ("false", "0")
    return bool(_SHORT_GROUP_RE.match(arg)) and ("e" in arg[1:] or "C" in arg[1:])


@attrs.frozen(kw_only=True)
class ContainerSection:
    """``[container]``: run the ranks inside a container."""

    runtime: str = opt("none", choices=("none", "apptainer", "pyxis"),
                       help="Container runtime: none, apptainer (apptainer exec) or pyxis (srun --container-image).")
    image: str = opt("", help="Container image (a .sif path for apptainer, an enroot/docker reference for pyxis).")
    mounts: list[str] = opt(factory=list, check=_check_mounts, help="Bind mounts \"src:dst[:ro]\".")
    workdir: str = opt("", help="Working directory inside the container; \"\" = the submission directory.")
    extra_args: list[str] = opt(factory=list, help="Extra arguments for the runtime (each one shell-quoted); "
                                 "apptainer's --cleanenv and --containall are refused (the ranks need the "
                                 "SLURM_* variables srun sets).")
    monitor_python: str = opt(
        "", help="A Python on the batch host, outside the container, that has hpcppo (e.g. a venv on a shared file "
                 "system): it runs the watchdog monitor, which must reach Slurm (scancel) and the srun process to stop "
                 "a hung step. Required on pyxis sites while watchdog.enable (a pyxis container has neither, as a "
                 "rule); "" = the monitor runs in the container like the ranks (apptainer).")

    def __attrs_post_init__(self) -> None:
        if self.runtime != "none" and not self.image:
            raise FieldValueError("image", f"runtime = {self.runtime!r} needs an image")
        if self.monitor_python and self.runtime == "none":
            raise FieldValueError("monitor_python", "runs the watchdog monitor outside the container, and runtime = "
                                                    "'none' has none: the monitor runs with env.python; remove it")
        cleaning = [a for a in self.extra_args if _cleans_environment(a)] if self.runtime == "apptainer" else []
        if cleaning:
            raise FieldValueError(
                "extra_args", f"{cleaning[0]!r} starts the ranks without the host environment: apptainer then keeps "
                "only a few variables and APPTAINERENV_* ones, so each rank loses the SLURM_* variables srun sets for "
                "it (its rank, node, task count) and would start as a world of one, beside MASTER_ADDR/PORT and the "
                "site's env and nccl variables; remove it (apptainer exec passes the host environment by default)")


@attrs.frozen(kw_only=True)
class PathsSection:
    """``[paths]``: where runs live."""

    runs_root: str = opt("runs", help="Directory holding run directories: absolute, or relative to the current "
                                      "directory; ~ and $VAR are expanded.")
    scratch: str = opt("", help="Fast node-local or parallel scratch directory for caches; \"\" = none.")


@attrs.frozen(kw_only=True)
class Hdf5Section:
    """``[hdf5]``: metrics file behaviour on this file system."""

    locking: bool = opt(True, help="HDF5 file locking (HDF5_USE_FILE_LOCKING); false on Lustre/GPFS without flock.")
    swmr: bool = opt(True, help="Single-writer/multiple-reader mode so readers see rows while training writes.")


@attrs.frozen(kw_only=True)
class TemplatesSection:
    """``[templates]``: the job script template."""

    dir: str = opt("", help="Directory of the site's own Jinja templates; \"\" = hpcppo's templates/.")
    name: str = opt("slurm.sbatch.j2", help="Template file rendered into job.sbatch.")


@attrs.frozen(kw_only=True)
class Site:
    """A site profile: one machine or cluster."""

    name: str = opt(help="Site name (what --site takes).", pattern=r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
    description: str = opt("", help="One line about the site.")
    scheduler: str = opt("slurm", choices=("slurm", "local"),
                         help="slurm (sbatch via submitit) or local (submitit's LocalExecutor on this machine).")
    gpu: str = opt("", choices=("", *GPU_KINDS),
                   help="GPU kind, for hpcppo plan and the memory check of compile (hpcppo.sizing.catalog); "
                        "\"\" = unknown or none.")
    slurm: SlurmSection = opt(factory=SlurmSection, help="Slurm request settings.")
    local: LocalSection = opt(factory=LocalSection, help="Local executor settings.")
    env: EnvSection = opt(factory=EnvSection, help="Job environment.")
    container: ContainerSection = opt(factory=ContainerSection, help="Container runtime.")
    paths: PathsSection = opt(factory=PathsSection, help="Run directories and scratch.")
    hdf5: Hdf5Section = opt(factory=Hdf5Section, help="HDF5 settings for this file system.")
    templates: TemplatesSection = opt(factory=TemplatesSection, help="Job script template.")
    defaults: dict[str, Any] = opt(
        factory=dict,
        help="Experiment keys this site sets for its hardware (e.g. model.dtype); the spec and -o override them.")

    def __attrs_post_init__(self) -> None:
        threads = self.env.threads_per_rank
        if self.scheduler == "slurm" and threads > self.slurm.cpus_per_task:
            # More OpenMP threads than the cores Slurm binds to a rank only oversubscribes them.
            raise FieldValueError("env.threads_per_rank", f"{threads} is more than slurm.cpus_per_task = "
                                                          f"{self.slurm.cpus_per_task} cores per rank")

    @property
    def gpus_per_node(self) -> int:
        """GPUs per node for this site's scheduler (0 = CPU site)."""
        return self.slurm.gpus_per_node if self.scheduler == "slurm" else self.local.gpus_per_node

    @property
    def device(self) -> str:
        """What the ranks compute on: "cuda" on a GPU site, "cpu" on a CPU site or where
        ``slurm.compute_device = "cpu"`` (GPUs requested, CPU compute)."""
        if self.gpus_per_node == 0 or (self.scheduler == "slurm" and self.slurm.compute_device == "cpu"):
            return "cpu"
        return "cuda"

    @property
    def max_time(self) -> str:
        return self.slurm.max_time if self.scheduler == "slurm" else self.local.max_time

    @property
    def max_nodes(self) -> int:
        return self.slurm.max_nodes if self.scheduler == "slurm" else 1
