"""Golden files pin the rendered sbatch scripts; structural checks say what every script must hold.

Regenerate after an intended template change with ``HPCPPO_UPDATE_GOLDEN=1 pytest tests/unit/test_render_golden.py``
and review the diff. Every golden script must pass ``bash -n`` and ``shellcheck -S error`` (shellcheck is
installed by tools/setup.sh; its absence fails the test instead of skipping it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import attrs
import pytest

from hpcppo import jobenv
from hpcppo.compiler import compile_config
from hpcppo.errors import ConfigError, ResolveError
from hpcppo.launch import render

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
RUN_DIR = Path("/runs/example-20260101-000000-abcd")
PYTHON = "/opt/hpcppo/venv/bin/python"  # sites without env.python get this one (the submitting interpreter)
GSM8K = REPO / "examples" / "gsm8k-qwen2.5-7b.toml"
ARITH = REPO / "examples" / "arith-tiny.toml"
ARITH_ASYNC = REPO / "examples" / "arith-tiny-async.toml"
APPTAINER = ["site.container.runtime=apptainer", "site.container.image=/images/hpcppo.sif",
             "site.container.extra_args=[\"--writable-tmpfs\"]",
             "site.container.monitor_python=\"\""]  # fmt: skip  (the monitor in apptainer exec, as the ranks)

CASES = {
    # name: (spec, site, overrides)
    "a100-cluster": (GSM8K, "a100-cluster", []),
    "h100-cluster": (GSM8K, "h100-cluster", []),  # pyxis
    "h100-cluster-apptainer": (GSM8K, "h100-cluster", APPTAINER),
    "local-slurm": (ARITH, "local-slurm", []),
    # split placement (docs/placement.md): a rollout rank beside a trainer on one node; a whole node of rollout ranks
    "local-slurm-split": (ARITH_ASYNC, "local-slurm", []),
    "h100-cluster-split": (GSM8K, "h100-cluster", ["rollout.placement=\"split\"", "resources.rollout_nodes=1",
                                                   "rollout.tensor_parallel_size=1"]),
}


def _compile(name: str):
    spec, site, overrides = CASES[name]
    return compile_config(spec, site, overrides, check_paths=False)


def _render(name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    # Pin the watchdog slot as it renders once the runner ships, independent of this checkout.
    monkeypatch.setattr(render, "watchdog_available", lambda: True)
    c = _compile(name)
    # The interpreter rule of jobs.compile_run: the site's python, else the submitting one.
    return render.render(c.site, c.experiment, c.plan, RUN_DIR, python=c.site.env.python or PYTHON)


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_golden_file(name, monkeypatch):
    text = _render(name, monkeypatch)
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("HPCPPO_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with HPCPPO_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"rendering of {name} changed; review and regenerate with HPCPPO_UPDATE_GOLDEN=1"


def test_golden_set_is_complete():
    assert sorted(p.stem for p in GOLDEN.glob("*.sbatch")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_passes_bash_n_and_shellcheck(name):
    path = GOLDEN / f"{name}.sbatch"
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is not installed (tools/setup.sh installs it)"
    proc = subprocess.run([shellcheck, "-S", "error", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _directives(text: str) -> list[str]:
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    block = []
    for line in lines[1:]:
        if not line.startswith("#SBATCH "):
            break
        block.append(line.removeprefix("#SBATCH "))
    # all directives sit in one block right after the shebang: sbatch stops reading at the first command
    assert sum(1 for line in lines if line.startswith("#SBATCH")) == len(block)
    return block


@pytest.mark.parametrize("name", sorted(CASES))
def test_script_anatomy(name):
    text = (GOLDEN / f"{name}.sbatch").read_text()
    c = _compile(name)
    site, plan = c.site, c.plan
    block = _directives(text)
    assert block == sorted(block)
    opts = dict(d.split("=", 1) if "=" in d else (d, None) for d in block)
    assert opts["--signal"] == f"USR2@{site.slurm.signal_lead_s}"
    assert "--requeue" in opts and "--no-requeue" not in opts
    assert opts["--nodes"] == str(plan.nodes)
    assert opts["--ntasks-per-node"] == str(plan.ranks_per_node)
    assert opts["--chdir"] == str(RUN_DIR)
    assert opts["--output"] == f"{RUN_DIR}/logs/slurm-%j.out" and opts["--open-mode"] == "append"
    if plan.device == "cuda":
        gpus = opts.get("--gres") if site.slurm.gpu_request == "gres" else opts.get("--gpus-per-node")
        assert gpus and gpus.endswith(str(plan.ranks_per_node))
    else:
        assert "--gres" not in opts and "--gpus-per-node" not in opts
    for key in ("partition", "account", "qos", "constraint"):
        value = getattr(site.slurm, key)
        assert opts.get(f"--{key}") == (value or None)

    # per-attempt log paths: the restart count is part of the attempt name
    assert 'HPCPPO_ATTEMPT="${SLURM_JOB_ID}.${SLURM_RESTART_COUNT:-0}"' in text
    assert 'HPCPPO_LOG_DIR="$HPCPPO_RUN_DIR/logs/attempt-$HPCPPO_ATTEMPT"' in text
    assert '--output="$HPCPPO_LOG_DIR/rank-%t.log"' in text
    # the site's environment block
    for module in site.env.modules:
        assert f"module load {module}" in text
    for name_, value in {**site.env.vars, **site.env.nccl}.items():
        assert f'export {name_}="{value}"' in text
    # rendezvous
    assert 'mapfile -t HPCPPO_HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")' in text
    assert f"MASTER_PORT=$(( {jobenv.PORT_BASE} + SLURM_JOB_ID % {jobenv.PORT_SPAN} ))" in text
    # one srun; one task per GPU (or CPU rank); the entry point's only argument is the run directory
    srun = text[text.index("\nsrun \\\n") + 1 :].split("\nrc=$?", 1)[0]
    assert text.count("\nsrun ") == 1
    assert f"--ntasks-per-node={plan.ranks_per_node}" in srun and f"--nodes={plan.nodes}" in srun
    assert srun.rstrip().endswith(f"-u -m hpcppo.train.main {RUN_DIR}")
    # the watchdog slot starts it in the background before the trainers
    assert f"-m hpcppo.watchdog {RUN_DIR} >>\"$HPCPPO_LOG_DIR/watchdog.log\" 2>&1 &" in text
    assert text.index("hpcppo.watchdog") < text.index("\nsrun ")


def test_container_variants():
    pyxis = (GOLDEN / "h100-cluster.sbatch").read_text()
    assert "--container-image=registry.kestrel.example/rl/hpcppo:0.1-cu130" in pyxis
    assert "--container-mounts=/data:/data,/home:/home,/scratch:/scratch" in pyxis
    assert "apptainer" not in pyxis
    app = (GOLDEN / "h100-cluster-apptainer.sbatch").read_text()
    assert "--container-image" not in app
    launch = "apptainer exec --nv --bind /data:/data --bind /home:/home --bind /scratch:/scratch --writable-tmpfs /images/hpcppo.sif"
    assert f"  {launch} python -u -m hpcppo.train.main {RUN_DIR}" in app
    # the watchdog runs in the same image
    assert f"{launch} python -u -m hpcppo.watchdog {RUN_DIR}" in app
    # pyxis: on the batch host with the site's host-side Python (srun's container options never reach it)
    host = f"/home/rl-team/venvs/hpcppo/bin/python -u -m hpcppo.watchdog {RUN_DIR} >>"
    assert [ln for ln in pyxis.splitlines() if "hpcppo.watchdog" in ln] == [
        f'{host}"$HPCPPO_LOG_DIR/watchdog.log" 2>&1 &']


def test_pyxis_site_without_a_host_python_for_the_monitor_is_refused(monkeypatch):
    monkeypatch.setattr(render, "watchdog_available", lambda: True)
    unset = ["site.container.monitor_python=\"\""]
    with pytest.raises(ResolveError) as info:
        compile_config(GSM8K, "h100-cluster", unset, check_paths=False)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("site 'h100-cluster' runs the ranks in pyxis containers and the watchdog monitor "
                                      "needs a Python with hpcppo on the batch host")
    assert "set site.container.monitor_python" in str(info.value) and "watchdog.enable = false" in str(info.value)
    c = compile_config(GSM8K, "h100-cluster", [*unset, "watchdog.enable=false"], check_paths=False)
    assert "hpcppo.watchdog" not in render.render(c.site, c.experiment, c.plan, RUN_DIR)
    # a script rendered without compile's check is refused too, instead of a monitor on the host's python
    c = compile_config(GSM8K, "h100-cluster", check_paths=False)
    c_site = attrs.evolve(c.site, container=attrs.evolve(c.site.container, monitor_python=""))
    with pytest.raises(ConfigError, match="site.container.monitor_python: a pyxis site's watchdog monitor"):
        render.render(c_site, c.experiment, c.plan, RUN_DIR)


def test_rendered_rendezvous_block_runs(tmp_path):
    """Execute the rendezvous block with a stand-in ``scontrol``: first host, port from the job id."""
    text = (GOLDEN / "a100-cluster.sbatch").read_text()
    block = text[text.index("# ---- rendezvous") : text.index("# ---- watchdog")]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text('#!/bin/bash\n[ "$1 $2 $3" = "show hostnames gpu[07-08]" ] && printf "gpu07\\ngpu08\\n"\n')
    fake.chmod(0o755)
    script = "set -euo pipefail\n" + block + 'printf "%s %s\\n" "$MASTER_ADDR" "$MASTER_PORT"\n'
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "4242424", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 0, proc.stderr
    addr, port = proc.stdout.splitlines()[-1].split()
    assert addr == "gpu07"
    # the batch script and the trainer (hpcppo.distributed.env, through jobenv) derive the same port from the job id
    assert int(port) == jobenv.port_from_job_id("4242424") == jobenv.PORT_BASE + 4242424 % jobenv.PORT_SPAN


def _srun_command(text: str) -> str:
    """The rendered trainer srun command (from ``srun \\`` through its last continued line)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("srun \\"))
    end = next(i for i in range(start, len(lines)) if not lines[i].endswith("\\"))
    return "\n".join(lines[start:end + 1])


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("cpus", ["12", None])
def test_srun_passes_cpus_per_task(name, cpus, monkeypatch, tmp_path):
    # Slurm >= 22.05: srun does not inherit sbatch's --cpus-per-task. Run the rendered srun line with a recording
    # srun function in place of Slurm's: the trainers' step must ask for the job's cores per task itself.
    command = _srun_command(_render(name, monkeypatch))
    script = f'srun() {{ printf "%s\\n" "$@" > "{tmp_path}/args"; }}\nHPCPPO_LOG_DIR=/tmp\n{command}\n'
    env = {"PATH": os.environ["PATH"]} | ({"SLURM_CPUS_PER_TASK": cpus} if cpus else {})
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    args = (tmp_path / "args").read_text().splitlines()
    assert f"--cpus-per-task={cpus or 1}" in args, args
    # No site here sets slurm.gpu_bind: GPUs are left as the site binds them (--gpu-bind=none would also leave
    # CUDA_VISIBLE_DEVICES unset); ranks find their device either way (tests/unit/test_gpu_binding.py).
    assert not any(a.startswith("--gpu-bind") for a in args), args
