"""Commands that read what runs left behind (:mod:`hpcppo.analysis`): runs, follow, logs, plot, metrics summary and
export, compare, watchdog replay."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from hpcppo.analysis import logs, plot
from hpcppo.analysis.compare import compare
from hpcppo.analysis.compare import render as render_comparison
from hpcppo.analysis.export import export_metrics, export_tensorboard
from hpcppo.analysis.follow import follow
from hpcppo.analysis.samples import format_samples, load_samples
from hpcppo.analysis.summary import render as render_summary
from hpcppo.analysis.summary import summarize_target
from hpcppo.analysis.targets import Target, damage_reported_by_caller, resolve_targets
from hpcppo.cli.common import err, runs_root
from hpcppo.config import load_resolved
from hpcppo.errors import ConfigError, HpcppoError, PathError
from hpcppo.fsutil import require_parent_dir
from hpcppo.launch import status
from hpcppo.launch.statustext import state_text
from hpcppo.metrics import load
from hpcppo.metrics.reader import damage_line
from hpcppo.rundir import RunDir, stray_entries
from hpcppo.watchdog import unknown_metrics
from hpcppo.watchdog.replay import format_replay, load_rules, logged_rows, replay, summarize_replay


#: Longest --interval of follow: time.sleep refuses what does not fit a C timestamp, and an hour between looks is
#: already no longer following.
MAX_INTERVAL_S = 3600.0


def _json_safe(value: Any) -> Any:
    """Non-finite floats as strings ("nan", "inf"): the output stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _metric_targets(args: argparse.Namespace) -> list[Target]:
    """The RUN arguments of the metric commands: run ids under the runs root, or paths (directory, .h5 file)."""
    return resolve_targets(args.runs, lambda: runs_root(args))


def _metric_names(texts: list[str] | None) -> list[str]:
    return [m.strip() for text in texts or [] for m in text.split(",") if m.strip()]


def _print_rich(renderable: Any) -> None:
    from rich.console import Console

    console = Console()
    (console if console.is_terminal else Console(width=160)).print(renderable)


def _damage_code(damaged: list[dict[str, str]]) -> int:
    """0, or PathError's exit code when a metric log was damaged: its intact rows were shown; one line on stderr
    per damaged file says what was lost."""
    for files in damaged:
        for path, what in files.items():
            err(damage_line(path, what))
    return PathError.exit_code if any(damaged) else 0


def _check_option(ok: bool, option: str, value: Any, allowed: str) -> None:
    """One line for an option's value that argparse's type let through (a number out of its range)."""
    if not ok:
        raise ConfigError(f"{option} {value}: must be {allowed}")


def cmd_runs(args: argparse.Namespace) -> int:
    root = runs_root(args)
    states, name = getattr(args, "state", None) or [], getattr(args, "name", None)
    rows = logs.run_rows(root, states=states, name=name)
    code = _report_strays(root)
    if args.json:
        print(json.dumps(_json_safe(rows), indent=2, default=str))
        return code
    if not rows:
        print(f"no runs under {root}" + (" match the filters" if states or name else ""))
        return code
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"runs under {root}, newest first", title_justify="left")
    for col in logs.RUN_COLUMNS:
        table.add_column(col, justify="right" if col in ("step", "reward", "kl", "age") else "left")
    for row in rows:
        table.add_row(*logs.run_row_cells(row))
    Console(width=200).print(table)
    return code


def _report_strays(root: Path) -> int:
    """One line for the entries named like runs that are none (a listing must not quietly show fewer runs than
    there are names); PathError's exit code then, 0 otherwise."""
    strays = stray_entries(root)
    if not strays:
        return 0
    more = f" and {len(strays) - 3} more" if len(strays) > 3 else ""
    err(f"{len(strays)} entr{'y' if len(strays) == 1 else 'ies'} of {root} named like a run {'is' if len(strays) == 1 else 'are'} "
        f"no run directory, not listed: {', '.join(strays[:3])}{more}")
    return PathError.exit_code


def cmd_follow(args: argparse.Namespace) -> int:
    # `not 0 < nan` holds, so nan is refused with 0 and the negatives
    _check_option(0 < args.interval <= MAX_INTERVAL_S, "--interval", args.interval,
                  f"a number of seconds > 0 and <= {MAX_INTERVAL_S:g}")
    run = logs.open_run(args.run, lambda: runs_root(args))
    st = follow(run, poll_s=args.interval)
    if st is None:  # detached with Ctrl-C
        return 0
    return 0 if st.state in ("COMPLETED", "PAUSED") else 1


def cmd_logs(args: argparse.Namespace) -> int:


    _check_option(args.lines is None or args.lines >= 0, "-n/--lines", args.lines,
                  "a whole number of lines >= 0 (0: none of what is there)")
    run = logs.open_run(args.run, lambda: runs_root(args))
    waiting = False
    try:
        while True:
            try:
                path, note = logs.find_log(run, rank=args.rank, attempt=args.attempt, watchdog=args.watchdog)
                break
            except HpcppoError as exc:  # no log yet: -f waits for the job to write one
                st = status.run_status(run) if args.follow and not logs.log_attempts(run) else None
                if st is None or st.final:
                    raise exc
                if not waiting:
                    print(f"# waiting for the job to write its log ({state_text(st.state, st.reason)})", file=sys.stderr,
                          flush=True)
                    waiting = True
                time.sleep(2.0)
        print(f"# {note}: {path}" if note else f"# {path}", file=sys.stderr, flush=True)
        out = logs.stdout_bytes()
        offset = logs.copy_log(path, out, lines=args.lines)
        if args.follow:
            logs.follow_file(path, out, offset=offset,
                             done=lambda: status.run_status(run).final)
    except KeyboardInterrupt:
        print(f"# stopped following; the job goes on (hpcppo status {run.run_id})", file=sys.stderr)
    return 0


def cmd_samples(args: argparse.Namespace) -> int:
    run = logs.open_run(args.run, lambda: runs_root(args))
    step, found = load_samples(run, args.step)
    if args.json:
        print(json.dumps(_json_safe({"run": run.run_id, "step": step, "samples": found}), indent=2, allow_nan=False))
    else:
        print(format_samples(run.run_id, step, found))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    if args.out is not None:
        require_parent_dir(args.out, "-o")
    runs = _metric_targets(args)
    metrics = plot.parse_metrics(args.metric)
    out = Path(args.out) if args.out is not None else Path(f"{runs[0].name}.png")
    plot.plot_runs(runs, metrics, out, x=args.x, smooth=args.smooth, title=args.title)
    print(f"wrote {out}: {', '.join(metrics)} of {len(runs)} run{'s' if len(runs) > 1 else ''} over {args.x}")
    return 0


def cmd_metrics_summary(args: argparse.Namespace) -> int:
    metrics, summaries, failed = _metric_names(args.metric), [], []
    for target in _metric_targets(args):
        try:
            with damage_reported_by_caller():
                summaries.append(summarize_target(target, metrics=metrics))
        except HpcppoError as exc:  # one run that has nothing to show does not hide the others
            if len(args.runs) == 1:
                raise
            err(str(exc))
            failed.append(exc.exit_code)
    if args.json:
        print(json.dumps(_json_safe(summaries), indent=2, allow_nan=False))
    else:
        for i, summary in enumerate(summaries):
            if i:
                print()
            _print_rich(render_summary(summary))
    return failed[0] if failed else _damage_code([s["damaged"] for s in summaries])


def cmd_metrics_export(args: argparse.Namespace) -> int:
    [target] = _metric_targets(args)
    if args.format == "tensorboard":
        with damage_reported_by_caller():
            info = export_tensorboard(target, args.out, all_attempts=args.all_attempts,
                                      columns=_metric_names(args.columns) or None)
        print(f"wrote {info['out']}: {info['scalars']:,} scalars over {info['steps']:,} rows of {info['run']} "
              f"(TensorBoard event file: tensorboard --logdir {info['out']})")
        return _damage_code([info["damaged"]])
    if args.out is None:
        raise ConfigError("metrics export: -o FILE is required (except with --format tensorboard)")
    with damage_reported_by_caller():
        info = export_metrics(target, args.out, fmt=args.format, all_attempts=args.all_attempts,
                              columns=_metric_names(args.columns) or None)
    view = "every row of every attempt, with a current column" if args.all_attempts else "the current history"
    print(f"wrote {info['out']}: {info['rows']:,} rows x {info['columns']} columns of {info['run']} "
          f"({info['format']}, {view})")
    return _damage_code([info["damaged"]])


def cmd_compare(args: argparse.Namespace) -> int:
    with damage_reported_by_caller():
        result = compare(_metric_targets(args))
    if args.json:
        print(json.dumps(_json_safe(result), indent=2, allow_nan=False))
    else:
        _print_rich(render_comparison(result))
    return _damage_code([s["damaged"] for s in result["summaries"]])


def cmd_watchdog_replay(args: argparse.Namespace) -> int:
    run = RunDir.open(runs_root(args), args.run)
    if args.rules:
        rules, source = load_rules(Path(args.rules)), args.rules
    else:
        rules, source = list(load_resolved(run.resolved).experiment.watchdog.rules), str(run.resolved)
    frame = load(run.path)
    rows, notes = logged_rows(frame.to_dict("records"), rules)
    if rows:  # with no row yet there are no columns either
        notes = [f"rules on {m!r} never fire: the run's metric log has no such column"
                 for m in unknown_metrics(rules, frame.columns)] + notes
    results = replay(rows, rules)
    summary = summarize_replay(results, len(rows))
    if args.json:
        print(json.dumps(_json_safe({
            "run": run.run_id, "rules_from": source, "rules": [r.name for r in rules], "steps": len(rows),
            "first_step": rows[0]["step"] if rows else None, "last_step": rows[-1]["step"] if rows else None,
            "notes": notes, "summary": summary,
            "decisions": [{"step": step, **decision.to_dict()} for step, decision in results],
        }), indent=2, allow_nan=False))
        return 0
    span = f" (steps {rows[0]['step']}..{rows[-1]['step']})" if rows else ""
    print(f"replay of {run.run_id}: {len(rules)} rules from {source} over {len(rows)} logged steps{span}")
    for note in notes:
        print(f"  note: {note}")
    for line in format_replay(results):
        print(line)
    print(summary)
    return 0
