"""A short real run with ``rollout.multi_turn.enable``: the job entry point, the HF engine, the tool worker with the
built-in calculator in the compact format. The model is scripted (tests/unit/tool_loop_fixture.py: its next token
depends on its current token only) to write ``<call>mul(D*D...)</call>`` after each ``<|assistant|>``, so every
trajectory has two assistant turns and one tool turn (``max_assistant_turns = 2``). The step's tool metrics reach
the HDF5 log; the tool worker and its scratch directory end with the run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hpcppo import metrics as hmetrics
from hpcppo.cli import main
from hpcppo.data import synthetic

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
class_name = "hpcppo.agent.builtin.Calculator"
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


def test_a_multi_turn_run_logs_its_tool_metrics_and_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    from hpcppo.agent.tool import ToolSpec
    from hpcppo.agent.worker import ToolWorker

    with ToolWorker([ToolSpec("hpcppo.agent.builtin.Calculator")]) as w:  # the check below can see a worker
        assert _workers_of(os.getpid()) == [w.pid]
    tiny = {"model": scripted_model_dir(tmp_path / "model", compact_tokenizer(), TABLE),
            "train": tmp_path / "train.parquet", "val": tmp_path / "val.parquet"}
    synthetic.write_split(tiny["train"], synthetic.generate_rows(64, seed=1, split="train", max_operand=19))
    synthetic.write_split(tiny["val"], synthetic.generate_rows(8, seed=2, split="val", max_operand=19))
    spec = write_spec(tmp_path / "exp.toml", tiny, extra=EXTRA)
    run = compile_run(spec, tmp_path / "runs", ["trainer.total_steps=2", "checkpoint.save_every=0",
                                                "data.max_response_length=64", "trainer.train_batch_size=8",
                                                "actor.ppo_mini_batch_size=8", "algorithm.adv_estimator=grpo"])
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # the ranks' TMPDIR: the tool worker's scratch goes there
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
    # `hpcppo metrics summary` shows the tool loop's headline metrics of a multi-turn run
    assert main(["metrics", "summary", str(run), "--json"]) == 0
    [summary] = json.loads(capsys.readouterr().out)
    assert summary["metrics"]["rollout/tool_calls_mean"]["last"] == 1.0
    assert {"rollout/turns_mean", "rollout/tool_errors", "rollout/tool_timeouts"} <= set(summary["metrics"])
