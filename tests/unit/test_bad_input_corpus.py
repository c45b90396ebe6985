"""Issue 33's corpus of hostile and careless invocations, each through the real command line (``python -m hpcppo.cli``
in a fresh interpreter, with a timeout): a refusal exits non-zero with one ``hpcppo: error:`` line (at most three
lines on stderr), no traceback, and writes nothing; a warning exits 0 with exactly one ``hpcppo: warning:`` line.

Every case names what it must say. The shared inputs (a compiled run with a metric log, a copy with a truncated log
and a damaged checkpoint, the random tiny model and reward model) are built once per module.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hpcppo.data.dataset import write_prompts_parquet
from test_analysis_summary import compiled_run, story

REPO = Path(__file__).resolve().parents[2]
ARITH = str(REPO / "examples" / "arith-tiny.toml")
GSM8K = str(REPO / "examples" / "gsm8k-qwen2.5-7b.toml")  # a GPU site's split: 2 x 8 H100, vLLM TP 2
TIMEOUT_S = 60  # a fresh interpreter on a loaded 2-core machine; each case takes ~1-3 s
LONG = "a" * 300
# What stands for /dev/null: a FIFO of the case's own. A command that replaced its output file atomically turned
# /dev/null itself into a regular file when run as root (the unfixed export did): the corpus must not do that again.
FIFO = b"<fifo>"
DEEP = "/".join(["b" * 200] * 25)
VERL = "python3 -m verl.trainer.main_ppo data.train_files=d.parquet actor_rollout_ref.model.path=/m"


@dataclass
class Case:
    argv: list[str]
    says: str  # a phrase of the one error or warning line
    warn: bool = False  # a warning (exit 0) rather than a refusal
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes | None] = field(default_factory=dict)  # written into the case's directory first; None: a
    # dangling symbolic link; FIFO: a named pipe (a file that is no regular file, as a device is)


def compile_(*extra: str) -> list[str]:
    return ["compile", ARITH, "--no-check-paths", "-q", "--runs-root", "{cwd}/runs", *extra]


def make_model(*extra: str) -> list[str]:
    return ["tools", "make-model", "--data-out", "", *extra]


CASES: dict[str, Case] = {
    # ------------------------------------------------------------------ tracebacks: output paths checked first
    "runs-root-env-name-too-long": Case(["compile", ARITH, "--no-check-paths", "-q"], "longer than the file system",
                                        env={"HPCPPO_RUNS_ROOT": "{cwd}/" + LONG}),
    "runs-root-too-deep": Case(["compile", ARITH, "--no-check-paths", "-q", "--runs-root", "{cwd}/" + DEEP],
                               "the path is"),
    "runs-root-under-proc": Case(["compile", ARITH, "--no-check-paths", "-q", "--runs-root", "/proc/hpcppo-runs"],
                                 "cannot create it"),
    "status-runs-root-too-long": Case(["status", "--runs-root", "{cwd}/" + LONG], "longer than the file system"),
    "tb-export-under-proc": Case(["metrics", "export", "{run}", "--format", "tensorboard", "-o", "/proc/hpcppo-tb"],
                                 "cannot create anything in /proc"),
    "tb-export-to-a-device": Case(["metrics", "export", "{run}", "--format", "tensorboard", "-o", "{cwd}/dev"],
                                  "is not a directory", files={"dev": FIFO}),
    "tb-export-empty": Case(["metrics", "export", "{run}", "--format", "tensorboard", "-o", ""], "an empty path"),
    "csv-export-under-proc": Case(["metrics", "export", "{run}", "-o", "/proc/m.csv"], "cannot create anything"),
    "csv-export-to-a-device": Case(["metrics", "export", "{run}", "-o", "{cwd}/dev", "--format", "csv"],
                                   "not a regular file", files={"dev": FIFO}),
    "csv-export-empty": Case(["metrics", "export", "{run}", "-o", ""], "an empty path"),
    "csv-export-name-too-long": Case(["metrics", "export", "{run}", "-o", "{cwd}/" + LONG + ".csv"],
                                     "longer than the file system"),
    "plot-under-proc": Case(["plot", "{run}", "-o", "/proc/p.png"], "cannot create anything"),
    "export-under-proc": Case(["export", "{run}", "--out", "/proc/hpcppo-export"], "cannot create anything"),
    "make-model-operand-past-int64": Case(make_model("--out", "{cwd}/m", "--max-operand", str(2**70)), "64-bit"),
    "make-model-operand-past-new-tokens": Case(make_model("--out", "{cwd}/m", "--max-operand", "5000000"),
                                               "new tokens"),
    "make-model-negative-seed": Case(make_model("--out", "{cwd}/m", "--seed", "-1"), "seed"),
    "make-model-empty-out": Case(make_model("--out", ""), "--out: an empty path"),
    "make-model-reward-out-a-device": Case(make_model("--out", "{cwd}/m", "--reward-out", "{cwd}/dev"),
                                           "is not a directory", files={"dev": FIFO}),
    "make-model-out-under-proc": Case(make_model("--out", "/proc/x/m"), "cannot create anything in /proc"),
    "make-model-out-is-data-out": Case(["tools", "make-model", "--out", "{cwd}/s", "--data-out", "{cwd}/s"],
                                       "the same directory"),
    "make-model-out-is-reward-out": Case(make_model("--out", "{cwd}/s", "--reward-out", "{cwd}/s/"),
                                         "the same directory"),
    "make-model-data-inside-out": Case(["tools", "make-model", "--out", "{cwd}/s", "--data-out", "{cwd}/s/data"],
                                       "lies inside"),
    "make-model-out-name-too-long": Case(make_model("--out", "{cwd}/" + LONG), "longer than the file system"),
    "make-model-out-a-file": Case(make_model("--out", "{cwd}/f/m"), "is a file", files={"f": b"x"}),
    "import-verl-nul-byte": Case(["import-verl", "{cwd}/run.sh", "-o", "{cwd}/exp.toml"], "NUL byte",
                                 files={"run.sh": (VERL + " trainer.experiment_name=a\x00b\n").encode()}),
    "import-verl-yaml-nul-escape": Case(["import-verl", "{cwd}/c.yaml", "-o", "{cwd}/exp.toml"], "reads back",
                                        files={"c.yaml": b'data:\n  train_files: "a\\0b"\nactor_rollout_ref:\n'
                                                         b'  model:\n    path: /m\n'}),
    "import-verl-out-under-proc": Case(["import-verl", "{cwd}/run.sh", "-o", "/proc/exp.toml"], "cannot create",
                                       files={"run.sh": (VERL + "\n").encode()}),
    "import-verl-out-a-device": Case(["import-verl", "{cwd}/run.sh", "-o", "{cwd}/dev", "--force"],
                                     "not a regular file", files={"run.sh": (VERL + "\n").encode(), "dev": FIFO}),
    "plot-to-a-device": Case(["plot", "{run}", "-o", "{cwd}/dev.png"], "not a regular file", files={"dev.png": FIFO}),
    "csv-export-into-a-directory": Case(["metrics", "export", "{run}", "-o", "{cwd}/d", "--format", "csv"],
                                        "is a directory", files={"d/keep": b""}),
    "make-model-out-a-dangling-link": Case(make_model("--out", "{cwd}/link"), "dangling link",
                                           files={"link": None}),
    # ------------------------------------------------------------------ silently accepted
    "runs-root-override-loses-to-option": Case(compile_("-o", "site.paths.runs_root={cwd}/other"),
                                               "-o site.paths.runs_root has no effect: --runs-root", warn=True),
    "runs-root-override-loses-to-env": Case(["compile", ARITH, "--no-check-paths", "-q", "-o",
                                             "site.paths.runs_root={cwd}/other"],
                                            "$HPCPPO_RUNS_ROOT is set", warn=True, env={"HPCPPO_RUNS_ROOT": "{cwd}/runs"}),
    "slurm-key-on-a-local-site": Case(compile_("-o", "site.slurm.partition=x"), "scheduler 'local': slurm keys"),
    "local-key-on-a-slurm-site": Case(compile_("--site", "local-slurm", "-o", "site.local.procs_per_node=3"),
                                      "scheduler 'slurm': local keys"),
    "token-baseline-with-bypass-mode": Case(compile_("-o", "algorithm.adv_estimator=tir_optimal_token_baseline", "-o",
                                                     "algorithm.rollout_correction.bypass_mode=true"),
                                            "which algorithm.rollout_correction.bypass_mode=true skips"),
    "token-budget-past-int64": Case(compile_("-o", f"actor.max_tokens_per_micro_batch={2**63}"), "64-bit"),
    "critic-budget-past-int64": Case(compile_("-o", f"critic.max_tokens_per_micro_batch={2**64}"), "64-bit"),
    "actor-lora-rank-a-billion": Case(compile_("-o", "actor.lora.rank=1000000000"), "<= 65536"),
    "critic-lora-rank-a-billion": Case(compile_("-o", "critic.lora.rank=1000000000"), "<= 65536"),
    "lora-rank-above-the-model": Case(["compile", "{tiny_spec}", "-q", "--runs-root", "{cwd}/runs", "-o",
                                       "actor.lora.rank=100"], "narrowest adapted layer"),
    "critic-lora-rank-above-the-model": Case(["compile", "{tiny_spec}", "-q", "--runs-root", "{cwd}/runs", "-o",
                                              "critic.lora.rank=65"], "narrowest adapted layer"),
    "rollback-past-the-run": Case(["rollback", "{run}", "--to", "99999999999999999999999"], "has 30 steps"),
    # split placement (issue 35, docs/placement.md): each refusal of the layout, and a key that does nothing
    "split-without-rollout-ranks": Case(compile_("-o", 'rollout.placement="split"'), "needs exactly one of"),
    "split-with-both-ways": Case(compile_("-o", 'rollout.placement="split"', "-o", "resources.rollout_nodes=1", "-o",
                                          "resources.rollout_ranks_per_node=1"), "both are set"),
    "split-without-a-trainer": Case(compile_("-o", 'rollout.placement="split"', "-o",
                                             "resources.rollout_ranks_per_node=2"), "leaves no trainer rank"),
    "split-rollout-nodes-on-one-node": Case(compile_("-o", 'rollout.placement="split"', "-o",
                                                     "resources.rollout_nodes=1"), "needs at least 2 nodes"),
    "rollout-ranks-colocated": Case(compile_("-o", "resources.rollout_ranks_per_node=1"),
                                    "only rollout.placement = \"split\" does"),
    "placement-unknown": Case(compile_("-o", 'rollout.placement="async"'), "allowed values: \"colocated\", \"split\""),
    "staleness-negative": Case(compile_("-o", "rollout.max_staleness=-1"), "must be >= 0"),
    "split-tp-not-dividing-rollout-ranks": Case(
        ["compile", GSM8K, "--site", "h100-cluster", "--no-check-paths", "-q", "--runs-root", "{cwd}/runs", "-o",
         'rollout.placement="split"', "-o", "resources.rollout_ranks_per_node=3"],
        "does not divide resources.rollout_ranks_per_node=3"),
    "split-prompts-over-trainer-ranks": Case(
        ["compile", GSM8K, "--site", "h100-cluster", "--no-check-paths", "-q", "--runs-root", "{cwd}/runs", "-o",
         'rollout.placement="split"', "-o", "resources.rollout_ranks_per_node=2", "-o",
         "rollout.tensor_parallel_size=1"], "cannot be split over the 12 trainer ranks"),
    "staleness-colocated": Case(compile_("-o", "rollout.max_staleness=2"), "colocated runs are on-policy", warn=True),
    "kv-cache-with-hf": Case(compile_("-o", "rollout.kv_cache_memory_mb=512"), "only the vLLM engine", warn=True),
    "vllm-keys-with-hf": Case(compile_("-o", "rollout.enforce_eager=true", "-o", "rollout.gpu_memory_utilization=0.3"),
                              "only the vLLM engine", warn=True),
    "critic-keys-without-a-critic": Case(compile_("-o", "algorithm.adv_estimator=grpo"), "trains no critic",
                                         warn=True),
    "val-n-with-greedy-validation": Case(compile_("-o", "rollout.val_n=4", "-o", "rollout.val_temperature=0"),
                                         "greedy validation", warn=True),
    "val-n-without-validation": Case(compile_("-o", "rollout.val_n=4", "-o", "trainer.test_freq=0", "-o",
                                              "trainer.val_before_train=false"), "validation never runs", warn=True),
    "multi-turn-keys-while-off": Case(compile_("-o", "rollout.multi_turn.max_assistant_turns=3"),
                                      "rollout.multi_turn.enable is false", warn=True),
    "overlong-settings-while-off": Case(compile_("-o", "reward_manager.overlong_buffer.len=4"),
                                        "the overlong buffer is off", warn=True),
    "overlong-len-equal-to-response": Case(compile_("-o", "reward_manager.name=dapo", "-o",
                                                    "reward_manager.overlong_buffer.enable=true", "-o",
                                                    "reward_manager.overlong_buffer.len=8"),
                                           "starts at 0 tokens", warn=True),
    "overlong-max-resp-len-past-responses": Case(compile_("-o", "reward_manager.name=dapo", "-o",
                                                          "reward_manager.overlong_buffer.enable=true", "-o",
                                                          "reward_manager.overlong_buffer.len=2", "-o",
                                                          "reward_manager.max_resp_len=20"),
                                                 "never applies", warn=True),
    "reward-model-keys-while-off": Case(compile_("-o", "reward_model.max_tokens_per_micro_batch=3"),
                                        "reward_model.enable is false", warn=True),
    "reward-model-budget-below-a-row": Case(compile_("-o", "reward_model.enable=true", "-o",
                                                     "reward_model.path={cwd}", "-o",
                                                     "reward_model.max_tokens_per_micro_batch=3"),
                                            "reward_model.max_tokens_per_micro_batch=3 cannot hold one row"),
    "actor-budget-below-a-row": Case(compile_("-o", "actor.max_tokens_per_micro_batch=1"), "cannot hold one row"),
    "reward-model-of-random-bytes": Case(["compile", "{tiny_spec}", "-q", "--runs-root", "{cwd}/runs", "-o",
                                          "reward_model.enable=true", "-o", "reward_model.path={bad_rm}"],
                                         "model.safetensors: its first 8 bytes"),
    "actor-of-random-bytes": Case(["compile", "{tiny_spec}", "-q", "--runs-root", "{cwd}/runs", "-o",
                                   "model.path={bad_rm}"], "not safetensors"),
    "verl-unbalanced-quote": Case(["import-verl", "{cwd}/run.sh", "-o", "{cwd}/exp.toml"], "quote opened here",
                                  files={"run.sh": (VERL + "'/x data.train_batch_size=8\n").encode()}),
    "verl-unbalanced-double-quote": Case(["import-verl", "{cwd}/run.sh", "-o", "{cwd}/exp.toml"], "never closed",
                                         files={"run.sh": (VERL + ' trainer.project_name="p\n').encode()}),
    # issue 34: verl's simulated user turns; a tool config that is none
    "verl-interaction-turns": Case(["import-verl", "{cwd}/run.sh", "-o", "{cwd}/exp.toml"], "interaction turns",
                                   files={"run.sh": (VERL + " actor_rollout_ref.rollout.multi_turn.interaction_config_"
                                                            "path=i.yaml\n").encode()}),
    "verl-tool-config-without-tools": Case(["import-verl", "{cwd}/run.sh", "-o", "{cwd}/exp.toml"],
                                           "not a verl tool config",
                                           files={"run.sh": (VERL + " actor_rollout_ref.rollout.multi_turn.enable=true actor_"
                                                                    "rollout_ref.rollout.multi_turn.tool_config_"
                                                                    "path=t.yaml\n").encode(),
                                                  "t.yaml": b"tool:\n  - class_name: x.Y\n"}),
    "verl-yaml-duplicate-key": Case(["import-verl", "{cwd}/c.yaml", "-o", "{cwd}/exp.toml"], "appears twice",
                                    files={"c.yaml": b"data:\n  train_files: d.parquet\nactor_rollout_ref:\n  model:\n"
                                                     b"    path: /m\ndata:\n  train_batch_size: 8\n"}),
    "verl-yaml-nested-duplicate-key": Case(["import-verl", "{cwd}/c.yaml", "-o", "{cwd}/exp.toml"], "appears twice",
                                           files={"c.yaml": b"data:\n  train_files: d.parquet\n  train_files: e\n"
                                                            b"actor_rollout_ref:\n  model:\n    path: /m\n"}),
    "override-key-with-nbsp": Case(compile_("-o", "actor.lr\u00a0=1e-4"), "NO-BREAK SPACE"),
    "override-value-with-nbsp": Case(compile_("-o", "actor.lr=\u00a01e-4"), "NO-BREAK SPACE"),
    "override-value-ending-in-zero-width-space": Case(compile_("-o", "actor.lr=1e-4\u200b"), "ZERO WIDTH SPACE"),
    "override-key-with-zero-width-space": Case(compile_("-o", "actor.\u200blr=1e-4"), "ZERO WIDTH SPACE"),
    "dry-run-with-wait": Case(["submit", ARITH, "--no-check-paths", "--dry-run", "--wait", "--runs-root",
                               "{cwd}/runs"], "--dry-run stops before submitting: --wait"),
    "dry-run-with-follow": Case(["submit", ARITH, "--no-check-paths", "--dry-run", "--follow", "--runs-root",
                                 "{cwd}/runs"], "--follow would have no job"),
    "status-of-a-root-with-a-fifo": Case(["status", "--runs-root", "{fifo_root}"], "(a FIFO)"),
    "runs-of-a-root-with-a-file": Case(["runs", "--runs-root", "{fifo_root}"], "(a file)"),
    "multi-turn-settings-while-off": Case(compile_("-o", "rollout.multi_turn.max_assistant_turns=3"),
                                          "rollout.multi_turn.enable is false", warn=True),
    # the arith tokenizer cannot write hermes calls (no '<' among its characters): refused at compile, not at job start
    "multi-turn-tokenizer-without-the-call-markers": Case(["compile", "{tool_spec}", "-q", "--runs-root", "{cwd}/runs",
                                                           "-o", "rollout.multi_turn.enable=true"],
                                                          "rollout.multi_turn.format: the hermes call format writes "
                                                          "<tool_call> and </tool_call>, which the tokenizer cannot"),
    "tools-kwargs-names-an-unconfigured-tool": Case(["compile", "{tools_spec}", "-q", "--runs-root", "{cwd}/runs"],
                                                    "row 5: extra_info.tools_kwargs names tool 'search'"),
    # ------------------------------------------------------------------ hpcppo samples (issue 34)
    "samples-none-yet": Case(["samples", "{cwd}/r"], "no samples yet", files={"r/metrics/.keep": b""}),
    "samples-step-without-samples": Case(["samples", "{cwd}/r", "--step", "9"], "steps with samples: 3",
                                         files={"r/metrics/.keep": b"", "r/samples/step-3.jsonl": b'{"turns": []}\n'}),
    "samples-damaged-file": Case(["samples", "{cwd}/r"], "line 1 is not JSON",
                                 files={"r/metrics/.keep": b"", "r/samples/step-3.jsonl": b"{oops\n"}),
    # ------------------------------------------------------------------ faults that mislead
    "status-flags-a-damaged-checkpoint": Case(["status", "{run}"], "damaged committed checkpoint: step 20 (extra.pt",
                                              warn=True),
}


def _write_checkpoint(run: Path, step: int, recorded: bytes, actual: bytes) -> None:
    ckpt = run / "checkpoints" / f"step-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "extra.pt").write_bytes(actual)
    marker = {"files": {"extra.pt": {"size": len(recorded), "crc32": f"{zlib.crc32(recorded):08x}"}}}
    (ckpt / "COMMITTED").write_text(json.dumps(marker))


@pytest.fixture(scope="module")
def shared(tmp_path_factory, random_tiny, random_tiny_rm) -> dict[str, str]:
    root = tmp_path_factory.mktemp("corpus")
    runs = root / "runs"
    run = compiled_run(runs)
    story(run)
    _write_checkpoint(run, 10, b"hello", b"hello")
    _write_checkpoint(run, 20, b"hello", b"hellx")  # the same size, other bytes: the CRC tells
    fifo_root = root / "fifo-runs"
    fifo_root.mkdir()
    os.mkfifo(fifo_root / "arith-tiny-20260101-000000-abcd")
    (fifo_root / "arith-tiny-20260101-000000-beef").write_text("")
    spec = root / "tiny.toml"
    text = Path(ARITH).read_text().replace("../artifacts/tiny-arith/model", str(random_tiny["model"]))
    text = text.replace("../artifacts/tiny-arith/data/train.parquet", str(random_tiny["train"]))
    spec.write_text(text.replace("../artifacts/tiny-arith/data/val.parquet", str(random_tiny["val"])))
    # issue 34: a row whose extra_info.tools_kwargs names a tool the spec does not configure
    rows = pq.read_table(random_tiny["train"]).to_pylist()
    rows[5]["extra_info"] = {"tools_kwargs": {"search": {"create_kwargs": {"q": "x"}}}}
    write_prompts_parquet(rows, root / "tools-kwargs.parquet")
    calculator = '\n[[rollout.multi_turn.tools]]\nclass_name = "hpcppo.agent.builtin.Calculator"\n'
    tools_spec = root / "tools.toml"
    tools_spec.write_text(spec.read_text().replace(str(random_tiny["train"]), str(root / "tools-kwargs.parquet"))
                          + calculator)
    tool_spec = root / "tool.toml"
    tool_spec.write_text(spec.read_text() + calculator)
    bad_rm = root / "bad-rm"
    shutil.copytree(random_tiny_rm, bad_rm)
    (bad_rm / "model.safetensors").write_bytes(os.urandom(4096))
    return {"runs": str(runs), "run": run.name, "tiny_spec": str(spec), "bad_rm": str(bad_rm), "tools_spec": str(tools_spec),
            "tool_spec": str(tool_spec), "fifo_root": str(fifo_root)}


def _tree(path: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``path``; files with their size and mtime (a lock taken and released leaves a directory's
    mtime changed and nothing else)."""
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns) if not p.is_dir() else (0, 0)
            for p in sorted(path.rglob("*"))}


def hpcppo(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), "HPCPPO_RUNS_ROOT": "", **env}
    return subprocess.run([sys.executable, "-m", "hpcppo.cli", *argv], capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=cwd, env=full)


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_input(name, shared, tmp_path):
    case = CASES[name]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for rel, data in case.files.items():
        (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
        if data is None:  # a link to nowhere
            (cwd / rel).symlink_to(cwd / "nowhere")
        elif data == FIFO:
            os.mkfifo(cwd / rel)
        else:
            (cwd / rel).write_bytes(data)
    fill = {**shared, "cwd": str(cwd)}
    argv = [a.format(**fill) for a in case.argv]
    if any(a in ("status", "rollback", "export", "metrics", "plot") for a in argv[:2]) and "--runs-root" not in argv:
        argv += ["--runs-root", shared["runs"]]
    env = {k: v.format(**fill) for k, v in case.env.items()}
    before_cwd, before_runs = _tree(cwd), _tree(Path(shared["runs"]))
    proc = hpcppo(argv, cwd, env)
    err = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    if case.warn:
        warnings_ = [line for line in err if line.startswith("hpcppo: warning: ")]
        assert proc.returncode == 0, proc.stderr
        assert len(warnings_) == 1 and case.says in warnings_[0], proc.stderr
        assert not [line for line in err if line.startswith("hpcppo: error")], proc.stderr
        return
    assert proc.returncode != 0, (proc.stdout, proc.stderr)
    assert 1 <= len(err) <= 3 and err[0].startswith("hpcppo: error: "), proc.stderr
    assert case.says in err[0], err[0]
    assert _tree(cwd) == before_cwd  # nothing written: no run directory, no model, no toml, no probe left
    assert _tree(Path(shared["runs"])) == before_runs


def test_plan_refuses_what_compile_refuses_about_the_engine(shared, tmp_path):
    """``plan`` and ``compile`` agree on a vLLM engine the job's Python lacks (both refuse) or has (both accept)."""
    has_vllm = importlib.util.find_spec("vllm") is not None
    plan = hpcppo(["plan", shared["tiny_spec"], "-o", "rollout.engine=vllm"], tmp_path, {})
    assert "Traceback" not in plan.stderr
    if has_vllm:
        assert plan.returncode == 0, plan.stderr
    else:
        assert plan.returncode == 2 and plan.stderr.startswith("hpcppo: error: rollout.engine: vLLM is not installed")
        compiled = hpcppo(["compile", shared["tiny_spec"], "-q", "-o", "rollout.engine=vllm", "--runs-root",
                           str(tmp_path / "runs")], tmp_path, {})
        assert compiled.returncode == 2 and compiled.stderr == plan.stderr
        assert not (tmp_path / "runs").exists()


def test_a_damaged_log_is_reported_the_same_way_by_every_reader(shared, tmp_path):
    """A log cut by 1 KiB: every reader says the same line about what was lost and exits with the same code."""
    run = Path(shared["runs"]) / shared["run"]
    copy = tmp_path / "runs" / "cut-20260101-000000-abcd"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoints"))
    last = sorted((copy / "metrics").glob("*.h5"))[-1]
    os.truncate(last, last.stat().st_size - 1024)
    root = ["--runs-root", str(copy.parent)]
    commands = [["metrics", "summary", copy.name], ["metrics", "export", copy.name, "-o", str(tmp_path / "m.csv")],
                ["metrics", "export", copy.name, "--format", "tensorboard", "-o", str(tmp_path / "tb")],
                ["compare", copy.name, str(run)], ["plot", copy.name, "-o", str(tmp_path / "p.png")],
                ["runs"], ["watchdog", "replay", copy.name]]
    lines = set()
    for argv in commands:
        proc = hpcppo([*argv, *root], tmp_path, {})
        assert "Traceback" not in proc.stderr, proc.stderr
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 5 and len(err) == 1, (argv, proc.returncode, proc.stderr)
        lines.add(err[0])
    [line] = lines
    assert line.startswith(f"hpcppo: error: {last}: damaged metric log: 0 of its 3 rows kept"), line
    assert line.endswith("nothing of it is shown"), line
