"""Login-node commands never import torch (or transformers): they run through ``hpcppo.cli.main`` in a
fresh interpreter that inspects ``sys.modules`` after each one. Slurm commands are stand-in scripts on
PATH here (the real cluster is exercised in tests/slurm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcppo.rundir import RunDir

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"
HEAVY = ("torch", "transformers", "vllm")

# Runs each command in turn in one interpreter and reports the heavy modules loaded so far: the first
# command that pulls torch in is the one named (later ones inherit it, which the test then also shows).
PROBE = """
import json, sys
from hpcppo.cli import main
for argv in json.loads(sys.argv[1]):
    try:
        rc = main(argv)
    except SystemExit as exc:  # --version, --help
        rc = exc.code
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
    print("PROBE " + json.dumps({{"argv": argv, "rc": rc, "heavy": heavy}}), flush=True)
"""


def fake_slurm(bin_dir: Path) -> None:
    """sacct/squeue/scancel stand-ins: one RUNNING job 4242, submitted now."""
    bin_dir.mkdir(exist_ok=True)
    scripts = {
        "sacct": "#!/bin/sh\necho \"4242|RUNNING|None|$(date +%Y-%m-%dT%H:%M:%S)|$(date +%Y-%m-%dT%H:%M:%S)|Unknown|00:00:05|n1|0:0\"\n",
        "squeue": "#!/bin/sh\nexit 0\n",
        "scancel": "#!/bin/sh\nexit 0\n",
    }  # fmt: skip
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)


def probe(commands: list[list[str]], env: dict[str, str], cwd: Path, prelude: str = "") -> list[dict]:
    code = prelude + PROBE.format(heavy=HEAVY)
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(commands)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)  # fmt: skip
    results = [json.loads(line.removeprefix("PROBE ")) for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert proc.returncode == 0 and len(results) == len(commands), proc.stdout + proc.stderr
    return results


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli-imports")
    runs = tmp / "runs"
    fake_slurm(tmp / "bin")
    env = {**os.environ, "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}"}
    env.pop("HPCPPO_RUNS_ROOT", None)
    return tmp, runs, env


def _make_run(runs: Path, site: str, job_id: str, env: dict[str, str], cwd: Path) -> str:
    before = set(runs.iterdir()) if runs.exists() else set()
    [result] = probe([["compile", str(ARITH), "--site", site, "--no-check-paths", "-q", "--runs-root", str(runs)]], env, cwd)
    assert (result["rc"], result["heavy"]) == (0, [])
    [new] = set(runs.iterdir()) - before
    run_id = new.name
    # A recorded attempt, as submit writes it (job 4242 on Slurm; a pid that is no submitit controller locally).
    RunDir.open(runs, run_id).add_attempt(job_id=job_id, scheduler=site, state="PENDING", kind="submit")
    return run_id


def test_login_node_commands_do_not_import_torch(setup):
    tmp, runs, env = setup
    slurm_run = _make_run(runs, "local-slurm", "4242", env, tmp)
    local_run = _make_run(runs, "local", "1", env, tmp)
    root = ["--runs-root", str(runs)]
    (runs / slurm_run / "checkpoints" / "step-0").mkdir(parents=True)  # so that rollback has a checkpoint
    (runs / slurm_run / "checkpoints" / "step-0" / "COMMITTED").write_text("{}\n")
    commands = [
        ["--version"],
        ["--help"],
        ["status", "--help"],
        ["compile", str(ARITH), "--site", "local", "--no-check-paths", "-q", *root],
        ["compile", str(REPO / "examples" / "gsm8k-qwen2.5-7b.toml"), "--site", "h100-cluster", "--no-check-paths", "-q", *root],
        ["submit", str(ARITH), "--site", "local-slurm", "--no-check-paths", "--dry-run", "-q", *root],
        ["submit", str(ARITH), "--site", "local", "--no-check-paths", "--dry-run", "-q", *root],
        ["preflight", "--site", "local-slurm", "--dry-run", "-q", *root],
        ["status", *root],
        ["status", "--json", *root],
        ["status", slurm_run, *root],
        ["status", local_run, "--json", *root],
        ["cancel", slurm_run, *root],
        ["cancel", local_run, *root],
        ["config", "show", str(ARITH), "--site", "local-slurm"],
        ["config", "show", str(ARITH), "--toml"],
        ["config", "explain", "actor.clip_ratio_c"],
        ["plan", str(ARITH), "--site", "local"],
        ["plan", str(REPO / "examples" / "gsm8k-qwen2.5-7b.toml"), "--site", "a100-cluster", "--json"],
        ["config", "explain", "site.slurm.partition"],
        ["config", "explain", "data.train_batch_size"],  # a verl name: the pointer and the hpcppo key
        ["config", "show", str(ARITH), "-o", "actor_rollout_ref.actor.clip_ratio_c=4.0"],
        ["import-verl", str(REPO / "examples" / "verl-gsm8k.sh"), "-o", str(tmp / "verl-gsm8k.toml"), "--force"],
        ["import-verl", "--table"],
        ["rollback", slurm_run, "--to", "5", *root],  # job 4242 runs: a request in its control inbox
        ["watchdog", "replay", local_run, *root],
        ["watchdog", "replay", slurm_run, "--json", *root],
    ]
    for result in probe(commands, env, tmp):
        assert result["heavy"] == [], result
        assert result["rc"] == 0, result


def test_the_probe_would_see_torch(setup):
    """The probe is not blind: torch imported along the way is reported."""
    tmp, runs, env = setup
    [result] = probe([["--version"]], env, tmp, prelude="import torch.nn\n")
    assert "torch" in result["heavy"]


def test_seeing_runs_commands_do_not_import_torch(setup):
    """runs, logs, plot and follow (issue 8) read a run's files only: no torch, however they end."""
    from hpcppo.metrics import STANDARD_COLUMNS, MetricsWriter

    tmp, runs, env = setup
    run_id = _make_run(runs, "local", "1", env, tmp)
    run = RunDir.open(runs, run_id)
    with MetricsWriter(run.path, STANDARD_COLUMNS, attempt=0, swmr=False) as w:
        for step in range(1, 6):
            w.log(step, {"reward/mean": step / 10, "kl/actor_ref": 0.01, "kl/coef": 0.001,
                         "perf/tokens_per_s": 100.0, "perf/step_time_s": 1.0})
        w.log_event(5, "paused", "stopping at a step boundary")
    (run.logs / "attempt-local-1").mkdir(parents=True)
    (run.logs / "attempt-local-1" / "rank-0.log").write_text("step 5/30\n")
    run.samples.mkdir()  # as hpcppo.train.samples writes them (issue 34)
    run.sample_file(5).write_text(json.dumps({"step": 5, "row": 0, "prompt": "1+2=", "reward": 1.0, "turns": [
        {"role": "model", "text": "<call>calculator(1+2)</call>"}, {"role": "tool", "text": "3"}]}) + "\n")
    root = ["--runs-root", str(runs)]
    commands = [
        (["runs", *root], (0,)),
        (["runs", "--json", "--state", "running,completed", "--name", "arith", *root], (0,)),
        (["logs", run_id, *root], (0,)),
        (["logs", run_id, "--rank", "0", "-n", "1", *root], (0,)),
        (["plot", run_id, "-o", str(tmp / "plot.png"), *root], (0,)),
        (["plot", run_id, "-m", "reward/mean", "-x", "tokens", "--smooth", "ema:0.9", "-o", str(tmp / "plot.svg"), *root],
         (0,)),
        (["samples", run_id, *root], (0,)),
        (["samples", run_id, "--step", "5", "--json", *root], (0,)),
        (["follow", run_id, *root], (0, 1)),  # job 1 is no local job: it ended, in some final state
        # refused in one line since issue 33 (a dry run has no job to follow), still without torch
        (["submit", str(ARITH), "--site", "local", "--no-check-paths", "--dry-run", "--follow", "-q", *root], (2,)),
    ]
    for result, (_, rcs) in zip(probe([argv for argv, _ in commands], env, tmp), commands):
        assert result["heavy"] == [], result
        assert result["rc"] in rcs, result


def test_metric_commands_do_not_import_torch(setup):
    """metrics summary / export (pyarrow) and compare, on runs with a metric log and events."""
    from hpcppo.metrics import STANDARD_COLUMNS, MetricsWriter
    from hpcppo.rundir.events import append_event

    tmp, runs, env = setup
    ids = [_make_run(runs, "local", "1", env, tmp) for _ in range(2)]
    for i, run_id in enumerate(ids):
        with MetricsWriter(runs / run_id, STANDARD_COLUMNS, attempt=0) as w:
            for step in range(1, 6):
                w.log(step, {c: step * (i + 1) for c in STANDARD_COLUMNS})
            w.log_event(3, "watchdog.raise_kl_coef", "kl")
        append_event(runs / run_id, kind="watchdog.raise_kl_coef", step=3, source="watchdog", attempt=1, message="kl")
    root = ["--runs-root", str(runs)]
    commands = [
        ["metrics", "--help"],
        ["metrics", "summary", *ids, *root],
        ["metrics", "summary", ids[0], "--json", "-m", "actor/entropy", *root],
        ["metrics", "export", ids[0], "-o", str(tmp / "m.parquet"), *root],
        ["metrics", "export", ids[0], "--all-attempts", "-o", str(tmp / "m.csv"), *root],
        ["compare", *ids, *root],
        ["compare", *ids, "--json", *root],
    ]
    for result in probe(commands, env, tmp):
        assert result["heavy"] == [], result
        assert result["rc"] == 0, result


def test_compile_checks_a_multi_turn_runs_tokenizer_without_torch(setup, random_tiny):
    """With the paths check, compile loads a multi-turn run's tokenizer (transformers' tokenizer classes: its chat
    template and call markers, hpcppo.agent.tokenizer) and still never imports torch, whether it accepts or refuses."""
    import shutil

    from hpcppo.tiny import build_tokenizer

    tmp, runs, env = setup
    model = tmp / "tool-model"
    model.mkdir()
    for f in random_tiny["model"].iterdir():
        if f.name == "config.json" or f.suffix == ".safetensors":
            shutil.copy(f, model / f.name)
    build_tokenizer("tool").save_pretrained(model)
    text = ARITH.read_text().replace("../artifacts/tiny-arith/model", str(model))
    text = text.replace("../artifacts/tiny-arith/data/train.parquet", str(random_tiny["train"]))
    text = text.replace("../artifacts/tiny-arith/data/val.parquet", str(random_tiny["val"]))
    text += ('\n[rollout.multi_turn]\nenable = true\nformat = "compact"\n'
             '[[rollout.multi_turn.tools]]\nclass_name = "hpcppo.agent.builtin.Calculator"\n')
    good, bad = tmp / "tool.toml", tmp / "tool-arith-tokenizer.toml"
    good.write_text(text)
    bad.write_text(text.replace(str(model), str(random_tiny["model"])))  # the arith tokenizer: no <call> token
    results = probe([["compile", str(good), "-q", "--runs-root", str(runs)],
                     ["compile", str(bad), "-q", "--runs-root", str(runs)]], env, tmp)
    assert [r["rc"] for r in results] == [0, 2], results
    assert all(not any(m.split(".")[0] in ("torch", "vllm") for m in r["heavy"]) for r in results), results
    assert "transformers" in results[0]["heavy"]  # the tokenizer was loaded: the probe saw the check run
