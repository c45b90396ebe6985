"""Issue 34, item 7: examples/arith-tool.toml with the calculator and with the tool disabled, in one invocation.

    .venv/bin/python tools/bench_tool_use.py                          # 20 steps each, a few minutes on 2 cores
    .venv/bin/python tools/bench_tool_use.py --plot docs/img/tool-use.png

Builds (or finds up to date) the tool variant of the tiny model and its data (``hpcppo tools make-model --variant
tool``) under --artifacts, then submits the example twice on the local site, one run after the other, the same spec
but for ``rollout.multi_turn.enable``: ``tool`` (the calculator answers the model's calls) and ``no-tool``
(``enable = false``: one turn, the model's call gets no answer). Prints both reward curves step by step, the mean
reward of the last 5 steps of each, their difference and ratio, and ``rollout/tool_calls_mean`` of the tool run
(its first 5 steps' mean against its last 5's); with --plot, both curves (``reward/mean`` and
``rollout/tool_calls_mean``) as one figure (``hpcppo plot``). Exit status 1 unless the tool run's last-5 mean is at
least --margin above the other's and its tool calls per trajectory rose.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from hpcppo import metrics as hmetrics
from hpcppo.cli import main as cli
from hpcppo.rundir import list_runs
from hpcppo.tiny import build_tiny_model_and_data

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "arith-tool.toml"
ARMS = {"tool": [], "no-tool": ["rollout.multi_turn.enable=false"]}


def run_arm(name: str, overrides: list[str], runs_root: Path) -> tuple[pd.DataFrame, float, Path]:
    """Submit the example with ``overrides`` and wait; its training rows, its wall seconds, its run directory."""
    before = {r.path for r in list_runs(runs_root)} if runs_root.exists() else set()
    argv = ["submit", str(EXAMPLE), "--site", "local", "--wait", "-q", "--runs-root", str(runs_root)]
    for o in [f"name=arith-tool-{name}", *overrides]:
        argv += ["-o", o]
    t0 = time.perf_counter()
    code = cli(argv)
    seconds = time.perf_counter() - t0
    (run,) = [r for r in list_runs(runs_root) if r.path not in before]
    if code != 0:
        logs = "\n".join(p.read_text()[-3000:] for p in run.logs.rglob("*.log"))
        raise SystemExit(f"the {name} run failed (exit {code}):\n{logs}")
    df = hmetrics.load(run.path)
    return df[df["step"] > 0].reset_index(drop=True), seconds, run.path


def arm_overrides(artifacts: Path, steps: int) -> list[str]:
    return [f"model.path={artifacts / 'model'}", f"data.train_files=['{artifacts / 'data' / 'train.parquet'}']",
            f"data.val_files=['{artifacts / 'data' / 'val.parquet'}']", f"trainer.total_steps={steps}",
            "trainer.test_freq=0", "trainer.val_before_train=false", "checkpoint.save_every=0"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts" / "tiny-tool",
                        help="the tool model's build: ARTIFACTS/model and ARTIFACTS/data (default: %(default)s)")
    parser.add_argument("--runs-root", type=Path, default=None, help="where the two runs go (default: a temporary "
                                                                     "directory, removed afterwards)")
    parser.add_argument("--margin", type=float, default=0.3, help="the least last-5 gain the tool must bring")
    parser.add_argument("--plot", type=Path, default=None, help="write both curves to this .png/.pdf/.svg")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    info = build_tiny_model_and_data(args.artifacts / "model", args.artifacts / "data", variant="tool")
    ws = info["warm_start"]
    print(f"tool model {args.artifacts / 'model'}: {'built in %.0f s' % (time.perf_counter() - t0) if info['built'] else 'up to date'} "
          f"(recorded build {info['build_seconds']:.0f} s); warm start with the tool: sampled "
          f"{ws['train_sampled_accuracy']:.3f}, greedy {ws['train_greedy_accuracy']:.3f}; without: "
          f"{ws['train_sampled_accuracy_without_tool']:.3f}")
    with tempfile.TemporaryDirectory(prefix="bench-tool-") as tmp:
        runs_root = args.runs_root or Path(tmp)
        results = {name: run_arm(name, arm_overrides(args.artifacts, args.steps) + extra, runs_root)
                   for name, extra in ARMS.items()}
        if args.plot:
            cli(["plot", *(str(p) for _, _, p in results.values()), "-m", "reward/mean,rollout/tool_calls_mean",
                 "-o", str(args.plot), "--title", f"examples/arith-tool.toml, {args.steps} steps: with the "
                                                  "calculator and without"])
    return report(results, args.margin)


def report(results: dict[str, tuple[pd.DataFrame, float, Path]], margin: float) -> int:
    tool, tool_s, _ = results["tool"]
    off, off_s, _ = results["no-tool"]
    calls = tool["rollout/tool_calls_mean"]
    print(f"{'step':>4s} {'reward (tool)':>14s} {'reward (no tool)':>17s} {'tool calls/trajectory':>22s}")
    for i in range(max(len(tool), len(off))):
        a = tool["reward/mean"].iloc[i] if i < len(tool) else float("nan")
        b = off["reward/mean"].iloc[i] if i < len(off) else float("nan")
        c = calls.iloc[i] if i < len(calls) else float("nan")
        print(f"{i + 1:4d} {a:14.3f} {b:17.3f} {c:22.3f}")
    last_tool, last_off = tool["reward/mean"].tail(5).mean(), off["reward/mean"].tail(5).mean()
    calls_first, calls_last = calls.head(5).mean(), calls.tail(5).mean()
    ratio = f"{last_tool / last_off:.1f}x" if last_off > 0 else "inf (no reward without the tool)"
    print(f"last-5 mean reward: tool {last_tool:.3f}, no tool {last_off:.3f}: difference {last_tool - last_off:+.3f}, "
          f"ratio {ratio}")
    print(f"reward (tool): step 1 {tool['reward/mean'].iloc[0]:.3f} -> last {tool['reward/mean'].iloc[-1]:.3f}; "
          f"tool calls per trajectory: first-5 mean {calls_first:.3f} -> last-5 mean {calls_last:.3f}")
    print(f"wall: tool {tool_s:.0f} s, no tool {off_s:.0f} s")
    ok = last_tool - last_off >= margin and calls_last > calls_first
    print("PASS" if ok else f"FAIL: needs a last-5 difference >= {margin} and rising tool calls")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
