"""The GPU sites' launch path against real Slurm, on the dev cluster's GPU-shaped partitions.

``tools/slurm-dev-cluster.sh`` runs two partitions that mimic the example GPU sites (their nodes declare
128 CPUs, 1-2 TB and 8 GPUs that are fake character devices): ``gpu`` (g1, g2) like ``sites/a100-cluster.toml``
and ``hopper`` (h1, h2) like ``sites/h100-cluster.toml``, each with the site's account, QOS, constraint or GRES
type and time limit allowed and nothing else.

* The scripts rendered for ``a100-cluster`` and ``h100-cluster`` pass ``sbatch --test-only`` there, byte for
  byte as hpcppo renders them; changing one directive (constraint, GRES type, account, QOS, memory) makes
  the controller refuse it, so the mimic checks what the sites set. The h100 site's pyxis options are not
  stripped: hpcppo puts them on the ``srun`` line in the script's body, never in ``#SBATCH`` directives
  (asserted), and ``--test-only`` reads only the directives. Whether pyxis accepts them is therefore not
  tested here (the plugin is absent from the dev cluster); the golden files pin them.
* ``hpcppo preflight --site local-slurm-gpu`` runs 2 nodes x 8 ranks through the srun line an a100 job gets
  (asserted option for option), with Slurm allocating 8 GPUs per node; the ranks compute on the CPU over gloo
  (``slurm.compute_device = "cpu"``).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from hpcppo import jobenv
from hpcppo.cli import main
from hpcppo.compiler import compile_config
from hpcppo.launch import render, status
from hpcppo.resources import resource_dir
from hpcppo.rundir import RunDir, list_runs

pytestmark = pytest.mark.slurm

GSM8K = resource_dir("examples") / "gsm8k-qwen2.5-7b.toml"
PYTHON = "/opt/hpcppo/venv/bin/python"  # never run: --test-only reads the directives only

# site -> (partition, nodes, the directives the mimicking partition must see)
GPU_SITES = {
    "a100-cluster": ("gpu", "g[1-2]", ["--partition=gpu", "--account=proj-rlhf", "--qos=normal", "--constraint=a100",
                                       "--gpus-per-node=8", "--ntasks-per-node=8", "--nodes=2", "--cpus-per-task=12",
                                       "--mem=983040M", "--time=1-00:00:00", "--exclusive"]),
    "h100-cluster": ("hopper", "h[1-2]", ["--partition=hopper", "--account=rl-team", "--qos=high", "--gres=gpu:h100:8",
                                          "--ntasks-per-node=8", "--nodes=2", "--cpus-per-task=16", "--mem=1638400M",
                                          "--time=1-00:00:00", "--exclusive"]),
}

# One directive changed at a time: the partition that mimics the site must refuse each (Slurm's own words).
REFUSED = [
    ("a100-cluster", "site.slurm.constraint=h100", "Invalid feature specification"),
    ("a100-cluster", "site.slurm.account=rl-team", "Invalid account or account/partition combination"),
    ("a100-cluster", "site.slurm.mem_per_task=200G", "Requested node configuration is not available"),
    ("h100-cluster", "site.slurm.gres_name=gpu:a100", "Requested node configuration is not available"),
    ("h100-cluster", "site.slurm.qos=normal", "Invalid qos specification"),
]


def _script(tmp_path: Path, site: str, overrides: list[str] = ()) -> Path:
    c = compile_config(GSM8K, site, list(overrides), check_paths=False)
    run_dir = tmp_path / f"{site}-run"
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{site}.sbatch"
    path.write_text(render.render(c.site, c.experiment, c.plan, run_dir, python=c.site.env.python or PYTHON))
    return path


def _test_only(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, text=True, timeout=60,
                          check=False, cwd=path.parent)


def _directives(text: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH ")]


def _srun_options(text: str) -> list[str]:
    """The options of the script's srun line (continuation lines up to the command)."""
    lines = text.splitlines()
    start = lines.index("srun \\")
    options = []
    for line in lines[start + 1:]:
        word = line.strip().removesuffix(" \\").strip()
        if not word.startswith("--"):
            break
        options.append(word)
    return options


@pytest.mark.parametrize("site", sorted(GPU_SITES))
def test_gpu_site_script_passes_sbatch_test_only(slurm_cluster, tmp_path, site):
    partition, nodes, expected = GPU_SITES[site]
    path = _script(tmp_path, site)
    text = path.read_text()
    directives = _directives(text)
    assert set(expected) <= set(directives), directives
    # Container options are srun options in the body (pyxis) or a command prefix (apptainer), never directives.
    assert not any(d.startswith("--container") for d in directives), directives
    if site == "h100-cluster":
        assert any(o.startswith("--container-image=") for o in _srun_options(text)), _srun_options(text)

    proc = _test_only(path)
    assert proc.returncode == 0, proc.stderr
    # "sbatch: Job 123 to start at 2026-... using 256 processors on nodes g[1-2] in partition gpu"
    m = re.search(r"to start at \S+ using (\d+) processors on nodes (\S+) in partition (\S+)", proc.stderr)
    assert m, proc.stderr
    # --exclusive: both whole nodes (128 declared CPUs each), the nodes of the site's mimic partition
    assert (int(m.group(1)), m.group(2), m.group(3)) == (256, nodes, partition), proc.stderr


@pytest.mark.parametrize(("site", "override", "error"), REFUSED, ids=[f"{s}:{o.split('.')[-1]}" for s, o, _ in REFUSED])
def test_mimic_partition_refuses_a_changed_directive(slurm_cluster, tmp_path, site, override, error):
    proc = _test_only(_script(tmp_path, site, [override]))
    assert proc.returncode != 0 and error in proc.stderr, proc.stderr


def test_two_by_eight_preflight_through_the_gpu_sites_srun_line(slurm_cluster, tmp_path, launched, capsys):
    root = tmp_path / "runs"
    t0 = time.monotonic()
    rc = main(["preflight", "--site", "local-slurm-gpu", "--nodes", "2", "--no-wait", "-q", "--runs-root", str(root)])
    assert rc == 0, capsys.readouterr().err
    [run] = list_runs(root)
    launched.append(run)
    job_id = run.read_record()["attempts"][0]["job_id"]
    st = status.wait_for(run, poll_s=0.5, timeout_s=240)
    elapsed = time.monotonic() - t0
    assert st.state == "COMPLETED", (st, _logs(run))
    print(f"2 x 8 preflight on the GPU-shaped partition: {elapsed:.1f} s from submit to COMPLETED")

    # The script: the a100 site's GPU request and srun options, word for word.
    text = run.script.read_text()
    directives = _directives(text)
    for d in ("--partition=gpu", "--account=proj-rlhf", "--qos=normal", "--constraint=a100", "--gpus-per-node=8",
              "--ntasks-per-node=8", "--nodes=2", "--exclusive"):
        assert d in directives, directives
    a100 = compile_config(GSM8K, "a100-cluster", [], check_paths=False)
    a100_text = render.render(a100.site, a100.experiment, a100.plan, run.path, python=PYTHON)
    assert _srun_options(text) == _srun_options(a100_text)
    assert "--nodes=2" in _srun_options(text) and "--ntasks-per-node=8" in _srun_options(text)

    # Slurm allocated the GPUs: all 8 of each node, 16 in all, of the a100 type.
    detail = subprocess.run(["scontrol", "show", "job", "-d", job_id], capture_output=True, text=True,
                            timeout=30).stdout
    assert "JOB_GRES=gpu:a100:16" in detail and "TresPerNode=gres:gpu:8" in detail, detail
    sacct = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "AllocTRES"], capture_output=True,
                           text=True, timeout=30).stdout
    assert "gres/gpu=16" in sacct.strip().split(","), sacct

    report = json.loads((run.path / "preflight.json").read_text())
    assert report["ok"] and report["world_size"] == 16 and report["backend"] == "gloo", report["checks"]
    assert report["nodes"] == ["g1", "g2"]
    # Ranks 0-7 on g1 and 8-15 on g2, local ranks 0-7 on each: vLLM's TP groups are consecutive ranks of one node.
    layout = [(r["rank"], r["host"], r["local_rank"]) for r in report["ranks"]]
    assert layout == [(r, "g1" if r < 8 else "g2", r % 8) for r in range(16)]
    assert [r["slurm"]["SLURM_NODEID"] for r in report["ranks"]] == ["0"] * 8 + ["1"] * 8
    # Every task sees the node's 8 allocated GPUs (no --gpu-bind): ranks pick cuda:<local rank> among them.
    assert {r["gpus"]["CUDA_VISIBLE_DEVICES"] for r in report["ranks"]} == {"0,1,2,3,4,5,6,7"}
    assert report["master"] == f"g1:{jobenv.PORT_BASE + int(job_id) % jobenv.PORT_SPAN}"
    # one log per rank, and the versions the attempt ran with (rank 0 records them: hpcppo.train.versions)
    assert sorted(p.name for p in (run.logs / f"attempt-{job_id}.0").iterdir()) == sorted(
        [f"rank-{r}.log" for r in range(16)] + [run.versions(f"{job_id}.0").name])


def _logs(run: RunDir) -> str:
    out = []
    for path in sorted(run.logs.rglob("*.log")) + sorted(run.logs.glob("slurm-*.out")):
        out.append(f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}")
    return "\n".join(out)


def test_tp2_rollout_groups_across_two_gpu_shaped_nodes(slurm_cluster, tmp_path, submit_job, wait_for_state):
    """TP=2 on 2 nodes x 8 ranks: the batch script hpcppo renders for local-slurm-gpu, its srun line unchanged, with
    the trainer entry point swapped for ``tests/slurm/_tp_worker.py`` (the job entry point cannot run TP > 1 on CPU:
    TP needs the vllm engine, which compile refuses without CUDA). The ranks of each TP group (consecutive ranks, as
    vLLM builds them) submit identical prompts and seeds, the 8 groups different ones, each rank trains on its own
    share, and RANK/LOCAL_RANK are exported from Slurm's variables before the engine is built. The engine is the
    recording stand-in for vllm (tests/_fakes/recording_vllm), NOT vLLM."""
    from hpcppo.launch import jobs

    crun = jobs.compile_run(None, "local-slurm-gpu", [], runs_root=str(tmp_path / "runs"), kind="preflight", nodes=2)
    text = crun.run.script.read_text()
    entry = f" -u -m {render.ENTRY_MODULE} {shlex.quote(str(crun.run.path))}\n"
    assert text.count(entry) == 1, text
    out = tmp_path / "out"
    out.mkdir()
    worker = Path(__file__).resolve().parent / "_tp_worker.py"
    script = text.replace(entry, f" -u {shlex.quote(str(worker))} {shlex.quote(str(out))} 2\n")
    assert _srun_options(script) == _srun_options(text)
    t0 = time.monotonic()
    job_id, _ = submit_job(script)
    info = wait_for_state(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}, 300)
    elapsed = time.monotonic() - t0
    assert info.state == "COMPLETED", (info, _logs(crun.run))
    print(f"TP=2 rollout on 2 x 8 GPU-shaped ranks: {elapsed:.1f} s from submit to COMPLETED")

    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(16)]
    hosts = [r["slurm"]["SLURMD_NODENAME"] for r in ranks]
    assert hosts == ["g1"] * 8 + ["g2"] * 8
    # Slurm's identity became the launcher variables vLLM's external launcher reads
    assert [(r["env_at_init"]["RANK"], r["env_at_init"]["LOCAL_RANK"]) for r in ranks] == [
        (r["slurm"]["SLURM_PROCID"], r["slurm"]["SLURM_LOCALID"]) for r in ranks]
    assert [r["env_at_init"]["LOCAL_RANK"] for r in ranks] == [str(i % 8) for i in range(16)]
    assert {(r["env_at_init"]["WORLD_SIZE"], r["env_at_init"]["LOCAL_WORLD_SIZE"]) for r in ranks} == {("16", "8")}
    assert {r["env"]["source"] for r in ranks} == {"slurm"}
    # 8 groups of 2 consecutive ranks; a group never spans the two nodes
    assert [tuple(r["groups"]) for r in ranks] == [(i // 2, i % 2) for i in range(16)]
    assert all(hosts[2 * g] == hosts[2 * g + 1] for g in range(8))
    for g in range(8):
        a, b = ranks[2 * g], ranks[2 * g + 1]
        assert a["generate"] == b["generate"], g  # rollout and validation: same prompts, same seeds
        assert a["rows"] != b["rows"], g  # but each rank trains on its own share
    rollouts = [ranks[2 * g]["generate"][0] for g in range(8)]
    prompts = [tuple(map(tuple, rows)) for rows, _ in rollouts]
    assert len(set(prompts)) == 8  # the groups on g1 and on g2 decode different prompts
    seeds = [s for _, group_seeds in rollouts for s in group_seeds]
    assert len(set(seeds)) == len(seeds)  # and different seeds
    trained = [{i for i, _ in ranks[2 * g]["rows"] + ranks[2 * g + 1]["rows"]} for g in range(8)]
    assert all(len(t) == 1 for t in trained) and len(set.union(*trained)) == 8  # 8 prompts per step, 1 per group
    # validation: every rank reports the same mean, each prompt counted once (only a group's first rank scores)
    vals = {r["val"]["val/score"] for r in ranks}
    assert vals == {sum(range(10)) / 10}, vals
