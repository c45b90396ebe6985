"""A short real run with ``rollout.multi_turn.enable``: the job entry point, the HF engine, the tool worker with the
built-in calculator in the compact format. The model is scripted (tests/unit/tool_loop_fixture.py: its next token
depends on its current token only) to write ``<call>mul(D*D...)</call>`` after each ``<|assistant|>``, so every
trajectory has two assistant turns and one tool turn (``max_assistant_turns = 2``). The step's tool metrics reach
the HDF5 log; the tool worker and its scratch directory end with the run. Each training row gives the tool its
index in every phase (``extra_info.tools_kwargs``): each trajectory's tool instance gets one row's, in every
phase."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hpcppo import metrics as hmetrics
from hpcppo.cli import main
from hpcppo.agent.kwargs import PHASES
from hpcppo.data import synthetic
from hpcppo.data.dataset import write_prompts_parquet

from _harness import compile_run, launch_ranks, logs_of, wait_all, write_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from tool_loop_fixture import compact_tokenizer, scripted_model_dir  # noqa: E402

DIGITS = list("0123456789")
CHAIN = ["<|assistant|>", "<call>", "m", "u", "l", "("]
TABLE = {a: [b] for a, b in zip(CHAIN, CHAIN[1:])} | {"(": DIGITS, "*": DIGITS, ")": ["</call>"]} | {
    d: ["*", ")"] for d in DIGITS}
EXTRA = """
[rollout.multi_turn]
enable = true
format = "compact"
max_assistant_turns = 2
[[rollout.multi_turn.tools]]
class_name = "agent_tools_fixture.LoggedCalculator"
config = {log = "LOG"}
tool_schema = {type = "function", function = {name = "mul", description = "arithmetic", parameters = {type = "object", properties = {expression = {type = "string"}}, required = ["expression"]}}}
"""


def _workers_of(pid: int) -> list[int]:
    """Tool-worker processes whose owner is ``pid`` (their command line ends with the owner's pid)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"hpcppo.agent.worker" in a for a in argv) and str(pid).encode() in argv[-3:]:
            found.append(int(entry))
    return found


RUN = ["trainer.total_steps=2", "checkpoint.save_every=0", "data.max_response_length=64", "trainer.train_batch_size=8",
       "actor.ppo_mini_batch_size=8", "algorithm.adv_estimator=grpo"]


def _tool_run(tmp_path: Path, monkeypatch, overrides=(), name: str = "e2e") -> tuple[Path, Path]:
    """Compile the multi-turn run (its tool logs each phase to ``tmp_path/<name>-phases.<pid>``; the scratch
    directory the ranks' TMPDIR points at): ``(run dir, scratch)``. The data and model are made once per tmp_path."""
    tiny = {"model": tmp_path / "model", "train": tmp_path / "train.parquet", "val": tmp_path / "val.parquet"}
    if not tiny["train"].exists():
        scripted_model_dir(tiny["model"], compact_tokenizer(), TABLE)
        rows = synthetic.generate_rows(64, seed=1, split="train", max_operand=19)
        for i, row in enumerate(rows):  # the row's index for every phase of its trajectory's tool (verl's tools_kwargs)
            row["extra_info"] = dict(row["extra_info"], tools_kwargs={"mul": {p: {"row": i} for p in PHASES}})
        write_prompts_parquet(rows, tiny["train"])
        synthetic.write_split(tiny["val"], synthetic.generate_rows(8, seed=2, split="val", max_operand=19))
    log = tmp_path / ("phases" if name == "e2e" else f"{name}-phases")
    spec = write_spec(tmp_path / f"{name}.toml", tiny, name=name, extra=EXTRA.replace("LOG", str(log)))
    here = str(Path(__file__).resolve().parents[1] / "unit")  # the ranks (and their tool workers) import the tool
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    run = compile_run(spec, tmp_path / "runs", [*RUN, *overrides])
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    monkeypatch.setenv("TMPDIR", str(scratch))  # the ranks' TMPDIR: the tool worker's scratch goes there
    return run, scratch


def _trained_phases(log: Path) -> list[list]:
    """Per tool instance that got a training row's arguments: its ``(phase, kwargs)`` in order."""
    phases: dict[str, list] = {}
    for path in log.parent.glob(f"{log.name}.*"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            phases.setdefault(entry["instance"], []).append((entry["phase"], entry["kwargs"]))
    return [p for p in phases.values() if p[0][1]]


def test_a_multi_turn_run_logs_its_tool_metrics_and_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    from hpcppo.agent.tool import ToolSpec
    from hpcppo.agent.worker import ToolWorker

    with ToolWorker([ToolSpec("hpcppo.agent.builtin.Calculator")]) as w:  # the check below can see a worker
        assert _workers_of(os.getpid()) == [w.pid]
    # validated after step 2, sampling as in training (greedy, the scripted model would write digits forever)
    run, scratch = _tool_run(tmp_path, monkeypatch, ["trainer.test_freq=2", "rollout.val_temperature=1.0"])
    procs = launch_ranks(run, 2, "a0")  # the local site's two ranks: the tool metrics are summed over them
    assert wait_all(procs, timeout=240) == [0, 0], logs_of(run)
    assert not [w for p in procs for w in _workers_of(p.pid)]
    assert not list(scratch.glob("hpcppo-tools-*"))  # removed by the worker's close
    df = hmetrics.load(run).set_index("step")
    assert list(df.index) == [1, 2]
    for step in (1, 2):
        row = df.loc[step]
        assert row["rollout/turns_mean"] == 2.0 and row["rollout/turns_max"] == 2.0
        assert row["rollout/tool_calls_mean"] == 1.0 and row["rollout/tool_calls/mul"] == 16  # 8 prompts x n = 2
        assert row["rollout/tool_errors"] == 0 and row["rollout/tool_failures/mul"] == 0
        assert row["rollout/tool_timeouts"] == 0 and row["time/tool_s"] > 0
        assert row["response/length_mean"] > 24  # two calls and the tool turn between them
    # the validation's own tool counts (8 validation prompts, one call each, over both ranks' shares)
    assert df.loc[2, "val/tool_calls_mean"] == 1.0 and df.loc[2, "val/tool_calls/mul"] == 8
    assert df.loc[2, "val/turns_max"] == 2.0 and df.loc[2, "val/tool_errors"] == 0 and df.loc[2, "val/tool_s"] > 0
    # every trajectory's instance got one training row's arguments in all four phases (validation rows give none)
    trained = _trained_phases(tmp_path / "phases")
    assert len(trained) == 32  # 2 steps x 8 prompts x n = 2
    for p in trained:
        assert [name for name, _ in p] == ["create", "execute", "calc_reward", "release"]
        assert all(kw == p[0][1] for _, kw in p) and 0 <= p[0][1]["row"] < 64
    # `hpcppo metrics summary` shows the tool loop's headline metrics of a multi-turn run
    assert main(["metrics", "summary", str(run), "--json"]) == 0
    [summary] = json.loads(capsys.readouterr().out)
    assert summary["metrics"]["rollout/tool_calls_mean"]["last"] == 1.0
    assert {"rollout/turns_mean", "rollout/tool_errors", "rollout/tool_timeouts"} <= set(summary["metrics"])


TOOL_KEYS = ("rollout/turns_mean", "rollout/turns_max", "rollout/tool_calls_mean", "rollout/tool_calls/mul",
             "rollout/tool_errors", "rollout/tool_failures/mul", "rollout/tool_timeouts")


def test_a_split_multi_turn_run_runs_the_tools_on_its_rollout_rank_as_colocated(tmp_path, monkeypatch):
    """1 trainer + 1 rollout rank at max_staleness 0 beside a 1-rank colocated run of the same spec: the rollout
    rank's tool worker gets each row's tools kwargs, the tool loop's counts travel with the units to the trainer's
    metrics, the same as colocated (the same rows: the same seeds and weights), and no tool worker or scratch
    directory outlives the run. The trainer rank never validates: it runs no tool worker, only the rollout rank."""
    quiet = ["trainer.val_before_train=false", "trainer.test_freq=0"]
    colocated, scratch = _tool_run(tmp_path, monkeypatch, [*quiet, "site.local.procs_per_node=1"], name="colocated")
    split, _ = _tool_run(tmp_path, monkeypatch, [*quiet, "site.local.procs_per_node=2", "rollout.placement=split",
                                                 "resources.rollout_ranks_per_node=1", "rollout.max_staleness=0"],
                         name="split")
    procs = {colocated: launch_ranks(colocated, 1, "a0"), split: launch_ranks(split, 2, "a0")}
    for run, ranks in procs.items():
        assert wait_all(ranks, timeout=240) == [0] * len(ranks), logs_of(run)
    assert not [w for ranks in procs.values() for p in ranks for w in _workers_of(p.pid)]
    assert not list(scratch.glob("hpcppo-tools-*"))
    a, b = hmetrics.load(colocated).set_index("step"), hmetrics.load(split).set_index("step")
    assert list(b.index) == [1, 2] and list(b["rollout/staleness_max"]) == [0.0, 0.0]
    for step in (1, 2):
        assert b.loc[step, "rollout/tool_calls/mul"] == 16 and b.loc[step, "time/tool_s"] > 0
        for key in (*TOOL_KEYS, "response/length_mean", "reward/mean", "actor/pg_loss"):
            assert abs(a.loc[step, key] - b.loc[step, key]) <= 1e-6, (step, key, a.loc[step, key], b.loc[step, key])
    # the rollout rank's tool saw the same rows' arguments, in all four phases, as the colocated rank's
    rows = {}
    for name in ("colocated", "split"):
        trained = _trained_phases(tmp_path / f"{name}-phases")
        assert len(trained) == 32
        assert all([ph for ph, _ in p] == ["create", "execute", "calc_reward", "release"] for p in trained)
        rows[name] = sorted(p[0][1]["row"] for p in trained)
    assert rows["split"] == rows["colocated"]
