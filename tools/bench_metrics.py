"""How fast the metric log is read: a synthetic 1,000,000-row log of 45 columns through ``hpcppo.metrics.load``,
``metrics summary``, ``metrics export`` and ``hpcppo plot``, each printed next to a plain ``h5py`` read of the same
bytes in the same run; then ``hpcppo metrics summary`` over 100 runs.

    .venv/bin/python tools/bench_metrics.py [--rows 1000000] [--runs 100] [--repeat 5] [--check] [--json]

The log is written by :class:`hpcppo.metrics.MetricsWriter` (the trainer's schema, chunking and fill values),
then filled in bulk with h5py: two attempts (600,000 and 400,000 rows, the second resumed 300 steps back) and
two rollbacks in the first, so the default view drops rows as a real run's would. Every timing is the median
of ``--repeat`` runs with the files in the page cache; the plain read and the loads take turns, and a ratio is
the median of the ratios of each round (a shared machine's load changes from second to second).
``--check`` exits 1 when ``load`` takes more than 2x the plain read. No torch.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hpcppo.metrics import STANDARD_COLUMNS, MetricsWriter, load  # noqa: E402
from hpcppo.rundir import RunPaths  # noqa: E402

COLUMNS = (*STANDARD_COLUMNS, "actor/kl_loss")  # 45
ROW_DATASETS = ("step", "attempt", "branch", "seq", "time", "values")
PLOT_METRICS = ("reward/mean", "kl/actor_ref", "kl/coef")


def write_attempt(run: Path, attempt: int, steps: np.ndarray, t0: float, seed: int) -> Path:
    """One attempt's file with ``len(steps)`` rows: the writer creates it, h5py fills it in bulk."""
    w = MetricsWriter(run, COLUMNS, attempt=attempt)
    w.close()
    n = len(steps)
    branch = np.concatenate([[0], np.cumsum(steps[1:] <= steps[:-1])]).astype(np.int64)
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((n, len(COLUMNS)))
    values[:, COLUMNS.index("kl/coef")] = 0.001
    values[:: 50, COLUMNS.index("time/checkpoint_s")] = 1.0
    values[np.arange(n) % 50 != 0, COLUMNS.index("time/checkpoint_s")] = np.nan
    with h5py.File(w.path, "a", libver="latest") as f:
        for name, data in (("step", steps.astype(np.int64)), ("attempt", np.full(n, attempt, np.int32)),
                           ("branch", branch), ("time", t0 + np.arange(n) * 0.5), ("values", values),
                           ("logged", (~np.isnan(values)).astype(np.uint8)),
                           ("seq", np.arange(n, dtype=np.int64))):  # seq last, as the writer does
            f[name].resize(n, axis=0)
            f[name][:] = data
    return w.path


def write_run(run: Path, rows: int, seed: int = 0) -> list[Path]:
    """Attempt 0: 60% of the rows with rollbacks at 1/3 and 2/3 of them; attempt 1: the rest, resumed 300 steps
    before attempt 0's last step."""
    n0 = int(rows * 0.6)
    third = n0 // 3
    s0 = np.concatenate([np.arange(third), np.arange(third - 50, 2 * third - 50),
                         np.arange(2 * third - 150, 2 * third - 150 + n0 - 2 * third)])
    s1 = np.arange(rows - n0) + int(s0[-1]) - 300
    return [write_attempt(run, 0, s0, 1.7e9, seed), write_attempt(run, 1, s1, 1.7e9 + n0, seed + 1)]


def plain_read(files: list[Path]) -> int:
    """What a hand-written reader does: every row dataset of every file into numpy."""
    nbytes = 0
    for path in files:
        with h5py.File(path, "r", swmr=True) as f:
            for name in ROW_DATASETS:
                nbytes += f[name][:].nbytes
    return nbytes


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        out = None  # the previous result is freed before the next one is made
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def interleaved(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, list[float]]:
    """Each function once per round, round after round, results dropped at once: all of them see the same
    machine (a shared box's load changes from second to second)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def plot_once(run: Path, out: Path) -> str | None:
    """The plot hook: hpcppo.analysis.plot.plot_runs when the module is there (None: it is not)."""
    try:
        from hpcppo.analysis import plot
        from hpcppo.analysis.targets import Target
    except ImportError:
        return None
    plot.plot_runs([Target(run.name, run, None)], PLOT_METRICS, out)
    return str(out)


def many_runs(root: Path, runs: int, rows: int, resolved: Path | None) -> list[Path]:
    paths = []
    for i in range(runs):
        run = root / f"bench-{i:03d}"
        write_attempt(run, 0, np.arange(rows), 1.7e9, i)
        if resolved is not None:
            shutil.copy(resolved, RunPaths(run).resolved)
        paths.append(run)
    return paths


def a_resolved_toml(root: Path) -> Path | None:
    """resolved.toml of examples/arith-tiny.toml (so summary has a total), or None if it cannot be compiled."""
    from hpcppo.cli import main

    runs = root / "compiled"
    with contextlib.redirect_stderr(io.StringIO()):
        rc = main(["compile", str(REPO / "examples" / "arith-tiny.toml"), "--site", "local", "--no-check-paths",
                   "-q", "--runs-root", str(runs)])
    found = [RunPaths(p).resolved for p in runs.iterdir() if RunPaths(p).resolved.is_file()] if rc == 0 else []
    return found[0] if found else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=100, help="runs for the many-runs summary")
    ap.add_argument("--run-rows", type=int, default=1000, help="rows of each of those runs")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--check", action="store_true", help="exit 1 if load takes more than 2x the plain read")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--keep", metavar="DIR", help="write the logs here and keep them")
    args = ap.parse_args(argv)

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-metrics-"))
    root.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"rows": args.rows, "columns": len(COLUMNS), "repeat": args.repeat}
    try:
        big = root / "big"
        t0 = time.perf_counter()
        files = write_run(big, args.rows)
        res["write_s"] = time.perf_counter() - t0
        res["file_mb"] = sum(p.stat().st_size for p in files) / 1e6
        plain_read(files)  # page cache warm for both

        nbytes = plain_read(files)
        res.update(plain_read_mb=nbytes / 1e6, load_rows=len(load(big)),
                   load_all_rows=len(load(big, attempts="all", branches="all")))
        t = interleaved({"plain": lambda: plain_read(files), "load": lambda: len(load(big)),
                         "load_all": lambda: len(load(big, attempts="all", branches="all"))}, args.repeat)
        med = {k: statistics.median(v) for k, v in t.items()}
        # the ratio of each round (same machine state), then their median
        ratio = {k: statistics.median(x / p for x, p in zip(t[k], t["plain"])) for k in ("load", "load_all")}
        res.update(plain_read_s=med["plain"], load_s=med["load"], load_all_s=med["load_all"],
                   load_ratio=ratio["load"], load_all_ratio=ratio["load_all"])

        from hpcppo.analysis.export import export_metrics
        from hpcppo.analysis.summary import render, summarize_target
        from hpcppo.analysis.targets import Target

        target = Target("big", big, None)
        summary_s, summary = timed(lambda: summarize_target(target), max(1, args.repeat // 2))
        from rich.console import Console

        render_s, _ = timed(lambda: Console(file=io.StringIO(), width=160).print(render(summary)), 1)
        res.update(summary_s=summary_s, render_s=render_s)
        res["export_parquet_s"], _ = timed(lambda: export_metrics(target, root / "big.parquet"), 1)
        res["export_csv_s"], _ = timed(lambda: export_metrics(target, root / "big.csv"), 1)
        if not args.no_plot:
            t0 = time.perf_counter()
            drawn = plot_once(big, root / "big.png")
            res["plot_s"] = time.perf_counter() - t0 if drawn else None

        resolved = a_resolved_toml(root)
        runs = many_runs(root / "many", args.runs, args.run_rows, resolved)
        from hpcppo.cli import main as cli

        def summary_in_process() -> int:
            with contextlib.redirect_stdout(io.StringIO()):
                return cli(["metrics", "summary", *map(str, runs)])

        res["summary_100_s"], rc = timed(summary_in_process, max(1, args.repeat // 2))
        assert rc == 0, rc
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "hpcppo.cli", "metrics", "summary", *map(str, runs)],
                              capture_output=True, text=True, cwd=REPO)  # fmt: skip
        res["summary_100_cli_s"] = time.perf_counter() - t0
        assert proc.returncode == 0, proc.stderr
        res["summary_runs"], res["summary_run_rows"] = args.runs, args.run_rows
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    if args.json:
        print(json.dumps(res, indent=2))
    else:
        r = res
        print(f"synthetic log: {r['rows']:,} rows x {r['columns']} columns in 2 attempts, {r['file_mb']:.0f} MB "
              f"(written in {r['write_s']:.1f} s); medians of {r['repeat']}, page cache warm")
        print(f"  plain h5py read of the same datasets   {r['plain_read_s']:7.3f} s  ({r['plain_read_mb']:.0f} MB)")
        print(f"  hpcppo.metrics.load (current history)  {r['load_s']:7.3f} s  {r['load_ratio']:.2f}x plain  "
              f"({r['load_rows']:,} rows)")
        print(f"  load(attempts='all', branches='all')   {r['load_all_s']:7.3f} s  {r['load_all_ratio']:.2f}x plain  "
              f"({r['load_all_rows']:,} rows)")
        print(f"  metrics summary (numbers)              {r['summary_s']:7.3f} s  (table: {r['render_s']:.3f} s)")
        print(f"  metrics export parquet / csv           {r['export_parquet_s']:7.3f} s / {r['export_csv_s']:.3f} s")
        if "plot_s" in r:
            print(f"  plot {', '.join(PLOT_METRICS)}   " + (f"{r['plot_s']:7.3f} s" if r["plot_s"] is not None
                                                          else "skipped: hpcppo.analysis.plot is not there"))
        print(f"summary of {r['summary_runs']} runs x {r['summary_run_rows']:,} rows: {r['summary_100_s']:.2f} s in "
              f"process, {r['summary_100_cli_s']:.2f} s as `hpcppo metrics summary` (a fresh interpreter)")
    if args.check and res["load_ratio"] > 2.0:
        print(f"FAIL: load takes {res['load_ratio']:.2f}x the plain read (> 2x)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
