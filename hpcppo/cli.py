"""``hpcppo`` command line: parse, call the library, print, map error classes to exit codes.

Commands that do not train (compile, submit --dry-run, status, cancel, rollback, watchdog replay, config) never
import torch: they are meant for login nodes. The library raises :class:`hpcppo.errors.HpcppoError` subclasses;
:func:`main` prints one line for them and returns the class's exit code.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path
from typing import Any

from hpcppo import __version__
from hpcppo.errors import HpcppoError

DEFAULT_SITE = "local"
_default_showwarning = warnings.showwarning
# The rule itself is hpcppo.config.runs_root.
RUNS_ROOT_HELP = "directory of run directories (default: $HPCPPO_RUNS_ROOT, else the site's paths.runs_root)"


def _err(msg: str) -> None:
    # One line, whatever the message quotes (a value with a newline must not start a second line).
    one_line = msg.replace("\r", "\\r").replace("\n", "\\n")
    print(f"hpcppo: error: {one_line}", file=sys.stderr)


# ----------------------------------------------------------------------------- commands
def cmd_compile(args: argparse.Namespace) -> int:
    from hpcppo.launch import jobs

    crun = jobs.compile_run(Path(args.spec), args.site, args.override, runs_root=args.runs_root,
                            check_paths=not args.no_check_paths)
    if not args.quiet:
        sys.stdout.write(crun.script)
    print(f"# run directory: {crun.run.path}", file=sys.stderr)
    return 0


def _submit_and_report(crun: Any, args: argparse.Namespace) -> int:
    from hpcppo.launch import jobs, status

    if args.dry_run:
        if not args.quiet:
            sys.stdout.write(crun.script)
        print(f"dry run: not submitted; run directory {crun.run.path}", file=sys.stderr)
        return 0
    following = getattr(args, "follow", False)
    job_id = jobs.submit_run(crun)
    print(f"submitted {crun.run.run_id} as job {job_id} ({crun.compiled.site.name})")
    print(f"  run directory: {crun.run.path}")
    if not args.wait and not following:
        print(f"  follow it with: hpcppo status {crun.run.run_id} --runs-root {crun.run.path.parent}")
        return 0
    last = {}

    def echo(st: dict[str, Any]) -> None:
        key = (st["state"], st.get("reason"))
        if key != last.get("key"):
            print(f"  {status.state_text(st)}", flush=True)
            last["key"] = key

    if following:
        from hpcppo.analysis.follow import follow

        st = follow(crun.run)
        if st is None:  # detached with Ctrl-C: the job goes on
            return 0
    else:
        st = status.wait_for(crun.run, echo=echo)
    if crun.compiled.job.kind == "train":
        from hpcppo.analysis.summary import format_start_end, start_end

        print(format_start_end(start_end(crun.run.path)))
    if st["state"] not in ("COMPLETED", "PAUSED"):
        print(f"  logs: {crun.run.logs}", file=sys.stderr)
    return 0 if st["state"] in ("COMPLETED", "PAUSED") else 1


def cmd_submit(args: argparse.Namespace) -> int:
    from hpcppo.launch import jobs

    crun = jobs.compile_run(Path(args.spec), args.site, args.override, runs_root=args.runs_root,
                            check_paths=not args.no_check_paths)
    return _submit_and_report(crun, args)


def cmd_preflight(args: argparse.Namespace) -> int:
    from hpcppo.launch import jobs

    crun = jobs.compile_run(None, args.site, args.override, runs_root=args.runs_root, kind="preflight", nodes=args.nodes)
    rc = _submit_and_report(crun, args)
    report = crun.run.preflight
    if args.wait and not args.dry_run:
        if report.exists():
            data = json.loads(report.read_text())
            print(f"preflight {'OK' if data['ok'] else 'FAILED'}: world size {data['world_size']} on {', '.join(data['nodes'])}"
                  f" ({data['backend']}); report: {report}")
            for row in data["bandwidth"]:
                print(f"  all-reduce {row['bytes']:>10,d} B: {row['time_s'] * 1e3:8.3f} ms  busbw {row['busbw_GBps']:.3f} GB/s")
            return 0 if data["ok"] and rc == 0 else 1
        _err(f"the preflight job left no report; see {crun.run.logs}")
        return 1
    return rc


def _runs_root(args: argparse.Namespace) -> Path:
    from hpcppo import config

    return config.runs_root(config.load_site(args.site), args.runs_root)


def cmd_status(args: argparse.Namespace) -> int:
    from hpcppo.errors import RunRecordError
    from hpcppo.launch import status
    from hpcppo.rundir import events
    from hpcppo.rundir import RunDir

    root = _runs_root(args)
    if args.run is not None:  # an empty id ('' from an unset variable) is refused, not read as "every run"
        run = RunDir.open(root, args.run)
        st, attempts = status.run_detail(run)
        if st["state"] == "UNREADABLE":
            raise RunRecordError(st["reason"])
        recent = events.read_events(run.path, last=10)
        if args.json:
            print(json.dumps(st | {"attempt_records": attempts, "events": recent}, indent=2, default=str))
        else:
            print(status.format_run(st, attempts, recent))
        return 0
    return cmd_runs(args)


def cmd_cancel(args: argparse.Namespace) -> int:
    from hpcppo.launch import jobs
    from hpcppo.rundir import RunDir

    run = RunDir.open(_runs_root(args), args.run)
    result = jobs.cancel_run(run)
    if result["cancelled"]:
        print(f"cancel requested for job {result['job_id']} of {run.run_id} (was {result['state']})")
    else:
        print(f"job {result['job_id']} of {run.run_id} already ended ({result['state']}); nothing to cancel")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from hpcppo.launch import jobs, status
    from hpcppo.rundir import RunDir

    run = RunDir.open(_runs_root(args), args.run)
    job_id = jobs.resume_run(run)
    print(f"resubmitted {run.run_id} as job {job_id}; it continues from its newest committed checkpoint")
    if not args.wait:
        return 0
    st = status.wait_for(run)
    from hpcppo.analysis.summary import format_start_end, start_end

    print(f"  {status.state_text(st)}")
    print(format_start_end(start_end(run.path)))
    return 0 if st["state"] in ("COMPLETED", "PAUSED") else 1


def cmd_rollback(args: argparse.Namespace) -> int:
    from hpcppo.launch import jobs
    from hpcppo.rundir import control
    from hpcppo.rundir import RunDir

    run = RunDir.open(_runs_root(args), args.run)
    rb = jobs.rollback_run(run, to_step=args.to, lr_scale=args.lr_scale)
    scale = rb.request.lr_scale
    lr = f"lr x{scale:g}" if scale is not None else f"lr x{control.DEFAULT_LR_SCALE:g} (the default)"
    which = "the newest committed" if args.to is None else f"the newest committed at or before step {args.to}"
    if rb.resubmitted:
        print(f"rollback of {run.run_id} (was {rb.state}): resubmitted as job {rb.job_id}; it restarts from "
              f"checkpoint step {rb.checkpoint} ({which}) with {lr}")
    else:
        print(f"rollback of {run.run_id} requested: job {rb.job_id} ({rb.state}) goes back to checkpoint step "
              f"{rb.checkpoint} ({which}, as of now) with {lr} at its next step boundary")
    print(f"  request: {rb.request.path}")
    if not args.wait:
        print(f"  follow it with: hpcppo status {run.run_id} --runs-root {run.path.parent}")
        return 0
    ack = control.wait_for_ack(run.path, rb.request, timeout_s=args.timeout, poll_s=2.0)
    if ack is None:
        _err(f"no acknowledgement within {args.timeout:g} s; the request stays queued: {rb.request.path}")
        return 1
    outcome = dict(ack.get("outcome") or {})
    status = outcome.pop("status", "?")
    details = ", ".join(f"{k} {v}" for k, v in outcome.items())
    print(f"  {status} at {ack.get('acked', '?')}" + (f": {details}" if details else ""))
    return 0 if status == "applied" else 1


def _json_safe(value: Any) -> Any:
    """Non-finite floats as strings ("nan", "inf"): the output stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def cmd_watchdog_replay(args: argparse.Namespace) -> int:
    from hpcppo.metrics import load
    from hpcppo.rundir import RunDir
    from hpcppo.watchdog import unknown_metrics
    from hpcppo.watchdog.replay import format_replay, load_rules, logged_rows, replay, summarize_replay

    run = RunDir.open(_runs_root(args), args.run)
    if args.rules:
        rules, source = load_rules(Path(args.rules)), args.rules
    else:
        from hpcppo.config import load_resolved

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


def _metric_targets(args: argparse.Namespace) -> list[Any]:
    """The RUN arguments of the metric commands: run ids under the runs root, or paths (directory, .h5 file)."""
    from hpcppo.analysis.targets import resolve_targets

    return resolve_targets(args.runs, lambda: _runs_root(args))


def _metric_names(texts: list[str] | None) -> list[str]:
    return [m.strip() for text in texts or [] for m in text.split(",") if m.strip()]


def _print_rich(renderable: Any) -> None:
    from rich.console import Console

    console = Console()
    (console if console.is_terminal else Console(width=160)).print(renderable)


def _damage_code(damaged: list[dict[str, str]]) -> int:
    """0, or PathError's exit code when a metric log was damaged: its intact rows were shown; one line on stderr
    per damaged file says what was lost."""
    from hpcppo.errors import PathError

    for files in damaged:
        for path, what in files.items():
            _err(f"{path}: damaged metric log: {what}; shown: its intact rows")
    return PathError.exit_code if any(damaged) else 0


def cmd_metrics_summary(args: argparse.Namespace) -> int:
    from hpcppo.analysis.summary import render, summarize_target
    from hpcppo.analysis.targets import damage_reported_by_caller

    metrics, summaries, failed = _metric_names(args.metric), [], []
    for target in _metric_targets(args):
        try:
            with damage_reported_by_caller():
                summaries.append(summarize_target(target, metrics=metrics))
        except HpcppoError as exc:  # one run that has nothing to show does not hide the others
            if len(args.runs) == 1:
                raise
            _err(str(exc))
            failed.append(exc.exit_code)
    if args.json:
        print(json.dumps(_json_safe(summaries), indent=2, allow_nan=False))
    else:
        for i, summary in enumerate(summaries):
            if i:
                print()
            _print_rich(render(summary))
    return failed[0] if failed else _damage_code([s["damaged"] for s in summaries])


def cmd_metrics_export(args: argparse.Namespace) -> int:
    from hpcppo.analysis.export import export_metrics
    from hpcppo.analysis.targets import damage_reported_by_caller

    [target] = _metric_targets(args)
    with damage_reported_by_caller():
        info = export_metrics(target, Path(args.out), fmt=args.format, all_attempts=args.all_attempts,
                              columns=_metric_names(args.columns) or None)
    view = "every row of every attempt, with a current column" if args.all_attempts else "the current history"
    print(f"wrote {info['out']}: {info['rows']:,} rows x {info['columns']} columns of {info['run']} "
          f"({info['format']}, {view})")
    return _damage_code([info["damaged"]])


def cmd_compare(args: argparse.Namespace) -> int:
    from hpcppo.analysis.compare import compare, render
    from hpcppo.analysis.targets import damage_reported_by_caller

    with damage_reported_by_caller():
        result = compare(_metric_targets(args))
    if args.json:
        print(json.dumps(_json_safe(result), indent=2, allow_nan=False))
    else:
        _print_rich(render(result))
    return _damage_code([s["damaged"] for s in result["summaries"]])


def cmd_plan(args: argparse.Namespace) -> int:
    from hpcppo import compiler
    from hpcppo.sizing import report
    from hpcppo.sizing.estimate import estimate

    # Not refused here when it does not fit: the table shows what is over, compile refuses.
    compiled = compiler.compile_config(Path(args.spec), args.site, args.override, check_paths=False, check_memory=False)
    budget = estimate(compiled.site, compiled.experiment, compiled.plan)
    if args.json:
        print(json.dumps(report.as_json(budget, site=compiled.site.name, spec=args.spec), indent=2, allow_nan=False))
    else:
        from rich.console import Console

        console = Console(width=max(120, Console().width))
        for part in report.render(budget, site=compiled.site.name, spec=args.spec):
            console.print(part)
    return 0


def cmd_import_verl(args: argparse.Namespace) -> int:
    from hpcppo.config import verl_import

    if args.table:
        sys.stdout.write(verl_import.render_doc())
        return 0
    if args.input is None:
        raise HpcppoError("give a verl command line or YAML file (or - for stdin), or --table")
    # One character past the limit is enough for the library to refuse the input; an endless stdin does not hang.
    stdin_text = sys.stdin.read(verl_import.MAX_INPUT_BYTES + 1) if args.input == "-" else None
    imp, problem = verl_import.import_verl(args.input, Path(args.out), force=args.force, name=args.name,
                                           stdin_text=stdin_text)
    for line in verl_import.format_report(imp):
        print(f"hpcppo: {line}", file=sys.stderr)
    print(f"wrote {args.out}: {len(imp.values)} keys from verl, {len(imp.report)} settings not translated "
          f"(listed above and at the end of the file)", file=sys.stderr)
    if problem:  # a cross-field check the single values could not see: written anyway, to be edited
        _err(f"{args.out} does not load yet: {problem}")
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    from hpcppo import compiler, config

    compiled = compiler.compile_config(Path(args.spec), args.site, args.override, check_paths=False)
    if args.toml:
        sys.stdout.write(config.to_toml(compiled))
    else:
        sys.stdout.write(config.render_provenance(compiled))
    return 0


def cmd_config_explain(args: argparse.Namespace) -> int:
    from hpcppo import config

    print(config.explain(args.key))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from hpcppo.rundir import RunDir
    from hpcppo.train.export import export_actor

    run = RunDir.open(_runs_root(args), args.run)
    info = export_actor(run.path, Path(args.out), step=args.step)
    print(f"exported step {info['step']} of {info['run']} to {info['out']}")
    return 0


def cmd_make_model(args: argparse.Namespace) -> int:
    from hpcppo.tiny import build_tiny_model_and_data

    # The library validates every value (ConfigError, exit 2) and refuses a foreign --out (PathError).
    overrides = {} if args.max_operand is None else {"max_operand": args.max_operand}
    info = build_tiny_model_and_data(Path(args.out), Path(args.data_out) if args.data_out else None, seed=args.seed,
                                     train_size=args.train_size, val_size=args.val_size, force=args.force, **overrides)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    ws = info["warm_start"]
    print(f"tiny model {args.out}: {info['architecture']}, {info['num_parameters']:,} parameters, "
          f"{'built in ' + format(info['build_seconds'], '.0f') + ' s' if info.get('built') else 'up to date'}")
    print(f"  warm start on held-out prompts: greedy {ws['greedy_accuracy']:.3f}, sampled {ws['sampled_accuracy']:.3f}")
    for split, path in sorted(info.get("data", {}).items()):
        print(f"  {split}: {path}")
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from hpcppo.analysis import logs

    root = _runs_root(args)
    states, name = getattr(args, "state", None) or [], getattr(args, "name", None)
    rows = logs.run_rows(root, states=states, name=name)
    if args.json:
        print(json.dumps(_json_safe(rows), indent=2, default=str))
        return 0
    if not rows:
        print(f"no runs under {root}" + (" match the filters" if states or name else ""))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"runs under {root}, newest first", title_justify="left")
    for col in logs.RUN_COLUMNS:
        table.add_column(col, justify="right" if col in ("step", "reward", "kl", "age") else "left")
    for row in rows:
        table.add_row(*logs.run_row_cells(row))
    Console(width=200).print(table)
    return 0


#: Longest --interval of follow: time.sleep refuses what does not fit a C timestamp, and an hour between looks is
#: already no longer following.
MAX_INTERVAL_S = 3600.0


def _check_option(ok: bool, option: str, value: Any, allowed: str) -> None:
    """One line for an option's value that argparse's type let through (a number out of its range)."""
    if not ok:
        from hpcppo.errors import ConfigError

        raise ConfigError(f"{option} {value}: must be {allowed}")


def cmd_follow(args: argparse.Namespace) -> int:
    from hpcppo.analysis.follow import follow
    from hpcppo.analysis.logs import open_run

    # `not 0 < nan` holds, so nan is refused with 0 and the negatives
    _check_option(0 < args.interval <= MAX_INTERVAL_S, "--interval", args.interval,
                  f"a number of seconds > 0 and <= {MAX_INTERVAL_S:g}")
    run = open_run(args.run, lambda: _runs_root(args))
    st = follow(run, poll_s=args.interval)
    if st is None:  # detached with Ctrl-C
        return 0
    return 0 if st["state"] in ("COMPLETED", "PAUSED") else 1


def cmd_logs(args: argparse.Namespace) -> int:
    import time

    from hpcppo.analysis import logs
    from hpcppo.launch.status import FINAL_STATES, run_status, state_text

    _check_option(args.lines is None or args.lines >= 0, "-n/--lines", args.lines,
                  "a whole number of lines >= 0 (0: none of what is there)")
    run = logs.open_run(args.run, lambda: _runs_root(args))
    waiting = False
    try:
        while True:
            try:
                path, note = logs.find_log(run, rank=args.rank, attempt=args.attempt, watchdog=args.watchdog)
                break
            except HpcppoError as exc:  # no log yet: -f waits for the job to write one
                st = run_status(run) if args.follow and not logs.log_attempts(run) else None
                if st is None or st["state"] in FINAL_STATES:
                    raise exc
                if not waiting:
                    print(f"# waiting for the job to write its log ({state_text(st)})", file=sys.stderr, flush=True)
                    waiting = True
                time.sleep(2.0)
        print(f"# {note}: {path}" if note else f"# {path}", file=sys.stderr, flush=True)
        out = logs.stdout_bytes()
        offset = logs.copy_log(path, out, lines=args.lines)
        if args.follow:
            logs.follow_file(path, out, offset=offset, done=lambda: run_status(run)["state"] in FINAL_STATES)
    except KeyboardInterrupt:
        print(f"# stopped following; the job goes on (hpcppo status {run.run_id})", file=sys.stderr)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from hpcppo.analysis import plot

    runs = _metric_targets(args)
    metrics = plot.parse_metrics(args.metric)
    out = Path(args.out) if args.out else Path(f"{runs[0].name}.png")
    plot.plot_runs(runs, metrics, out, x=args.x, smooth=args.smooth, title=args.title)
    print(f"wrote {out}: {', '.join(metrics)} of {len(runs)} run{'s' if len(runs) > 1 else ''} over {args.x}")
    return 0


# ----------------------------------------------------------------------------- parser
def _add_compile_args(p: argparse.ArgumentParser, *, spec: bool = True) -> None:
    if spec:
        p.add_argument("spec", help="experiment spec (TOML)")
    p.add_argument("--site", default=DEFAULT_SITE, help=f"site profile name or path (default: {DEFAULT_SITE})")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. -o actor.lr=1e-6 (repeatable; site keys as site.KEY)")
    p.add_argument("--runs-root", help=RUNS_ROOT_HELP)
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the job script")
    if spec:
        p.add_argument("--no-check-paths", action="store_true",
                       help="do not check that model and data paths exist (they may exist only on the cluster)")


def _add_runs_root_args(p: argparse.ArgumentParser, *,
                        site_help: str = "site whose runs root holds the run") -> None:
    """Where a command finds run directories: the site's ``paths.runs_root`` unless ``--runs-root`` says."""
    p.add_argument("--site", default=DEFAULT_SITE, help=site_help)
    p.add_argument("--runs-root", help=RUNS_ROOT_HELP)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpcppo",
                                     description="PPO RLHF for LLMs on Slurm clusters, driven by a config compiler.")
    parser.add_argument("--version", action="version", version=f"hpcppo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("compile", help="validate and resolve a spec, write the run directory, print the job script")
    _add_compile_args(p)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("submit", help="compile and submit (Slurm through submitit, or the local executor)")
    _add_compile_args(p)
    p.add_argument("--dry-run", action="store_true", help="stop before submitting")
    p.add_argument("--wait", action="store_true", help="wait until the job ends and report its state")
    p.add_argument("--follow", action="store_true",
                   help="watch the job live (state, steps, metrics, events), then report as --wait does; Ctrl-C "
                        "detaches and the job goes on")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("preflight", help="a short distributed check job through the whole launch path")
    _add_compile_args(p, spec=False)
    p.add_argument("--nodes", type=int, default=None, help="nodes to check (default 1)")
    p.add_argument("--dry-run", action="store_true", help="stop before submitting")
    p.add_argument("--no-wait", dest="wait", action="store_false", help="return after submitting")
    p.set_defaults(func=cmd_preflight, wait=True)

    p = sub.add_parser("plan", help="per-GPU memory budget and step-time / GPU-hour estimate of a spec on a site, "
                                    "each constant with its source (docs/plan.md)")
    p.add_argument("spec", help="experiment spec (TOML)")
    p.add_argument("--site", default=DEFAULT_SITE, help=f"site profile name or path (default: {DEFAULT_SITE})")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. -o actor.fsdp.param_offload=true (repeatable)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("status", help="list runs, or one run in detail")
    p.add_argument("run", nargs="?", help="run id")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_runs_root_args(p, site_help="site whose runs root to list (default: local)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("cancel", help="cancel a run's job")
    p.add_argument("run", help="run id")
    _add_runs_root_args(p)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("resume", help="submit a stopped run again (paused, preempted, failed): it continues from "
                                      "its newest committed checkpoint")
    p.add_argument("run", help="run id")
    p.add_argument("--wait", action="store_true", help="wait until the job ends and report its state")
    _add_runs_root_args(p)
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("rollback", help="roll a run back to a committed checkpoint with a lower learning rate: a "
                                        "running job applies it at its next step; a stopped run is resubmitted")
    p.add_argument("run", help="run id")
    p.add_argument("--to", type=int, default=None, metavar="STEP",
                   help="go back to the newest committed checkpoint at or before STEP (default: the newest)")
    p.add_argument("--lr-scale", type=float, default=None, metavar="X",
                   help="multiply the learning rates by X, in (0, 1] (default: 0.5)")
    p.add_argument("--wait", action="store_true", help="wait for the trainer's acknowledgement and print it")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="with --wait: give up after S seconds (default: 600)")
    _add_runs_root_args(p)
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("watchdog", help="watchdog tools")
    wsub = p.add_subparsers(dest="watchdog_command", required=True, metavar="SUBCOMMAND")
    q = wsub.add_parser("replay", help="what the watchdog rules would have done over a run's metric log, step by "
                                       "step (tune thresholds on past runs)")
    q.add_argument("run", help="run id")
    q.add_argument("--rules", metavar="FILE",
                   help="TOML file of [[rules]] tables and an optional `defaults = true|false` (default: the rules "
                        "in the run's resolved.toml)")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    _add_runs_root_args(q)
    q.set_defaults(func=cmd_watchdog_replay)

    p = sub.add_parser("runs", help="every run under the runs root, newest first: state, step/total, last "
                                    "reward and KL, site, age")
    p.add_argument("--state", action="append", metavar="STATE",
                   help="only runs in this state (RUNNING, PENDING, COMPLETED ...; comma-separated or repeated)")
    p.add_argument("--name", metavar="TEXT", help="only run ids containing TEXT (a glob when it has *?[)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_runs_root_args(p, site_help="site whose runs root to list (default: local)")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("follow", help="watch a run live until its job ends: state, a progress bar over the steps, "
                                      "reward, KL, events (Ctrl-C detaches; the job goes on)")
    p.add_argument("run", help="run id (or run directory)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between looks, > 0 and <= 3600 (default: 1)")
    _add_runs_root_args(p)
    p.set_defaults(func=cmd_follow)

    p = sub.add_parser("logs", help="print a run's job log: the batch log, one rank's or the watchdog's (-f follows it "
                                    "live)")
    p.add_argument("run", help="run id (or run directory)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, default=None, metavar="R", help="this rank's log (default: the batch log; "
                                                                           "rank 0's on a local run)")
    which.add_argument("--watchdog", action="store_true",
                       help="the log of the monitor beside the trainer (logs/attempt-<A>/watchdog.log)")
    p.add_argument("--attempt", default=None, metavar="A",
                   help="attempt (local-1745, 4242.0, or a job id: its latest restart; default: the newest)")
    p.add_argument("-n", "--lines", type=int, default=None, metavar="N", help="only the last N lines (0: none, with -f only what comes)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing what is appended until the job ends")
    _add_runs_root_args(p)
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("plot", help="metric curves of runs as an image: one panel per metric, runs overlaid, "
                                    "abandoned branches faint, rollbacks/pauses/resumes as vertical lines")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run id, run directory or metric file (.h5)")
    p.add_argument("-m", "--metric", action="append", metavar="NAMES",
                   help="metrics, comma-separated or repeated (default: reward/mean,kl/actor_ref,kl/coef)")
    p.add_argument("--smooth", default=None, metavar="SPEC", help="none, ema:A (e.g. ema:0.9) or window:N")
    p.add_argument("-x", default="step", metavar="AXIS",
                   help="x axis: step, wall time, or tokens processed (default: step)")
    p.add_argument("-o", "--out", default=None, metavar="FILE",
                   help="image file, .png, .pdf or .svg (default: <first run>.png)")
    p.add_argument("--title", default=None, help="a heading above the legend")
    _add_runs_root_args(p)
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("export", help="write a checkpoint's actor as a Hugging Face directory (safetensors)")
    p.add_argument("run", help="run id")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest committed)")
    p.add_argument("--out", required=True, help="output directory (must not exist)")
    _add_runs_root_args(p)
    p.set_defaults(func=cmd_export)

    run_help = "run id, run directory, or metric file (attempt-NNNN.h5)"
    p = sub.add_parser("metrics", help="a run's metric log: summary table, export to Parquet/CSV")
    msub = p.add_subparsers(dest="metrics_command", required=True, metavar="SUBCOMMAND")
    q = msub.add_parser("summary", help="per run: steps done of total, last/smoothed/best of the headline metrics, "
                                        "the first non-finite value, the watchdog's and other events")
    q.add_argument("runs", nargs="+", metavar="RUN", help=run_help)
    q.add_argument("-m", "--metric", action="append", metavar="NAMES",
                   help="also show these metrics (comma-separated or repeated)")
    q.add_argument("--json", action="store_true", help="machine-readable output (a list, one object per run)")
    _add_runs_root_args(q)
    q.set_defaults(func=cmd_metrics_summary)
    q = msub.add_parser("export", help="write a run's metrics as one Parquet or CSV file (atomically)")
    q.add_argument("runs", nargs=1, metavar="RUN", help=run_help)
    q.add_argument("-o", "--out", required=True, metavar="FILE", help="file to write (replaced if it exists)")
    q.add_argument("--format", default=None, metavar="FORMAT",
                   help="parquet or csv (default: from the suffix of FILE)")
    q.add_argument("--all-attempts", action="store_true",
                   help="every row of every attempt, abandoned branches included, with a boolean current column "
                        "(default: the current history, one row per step)")
    q.add_argument("--columns", action="append", metavar="NAMES",
                   help="only these metric columns (comma-separated or repeated; default: all)")
    _add_runs_root_args(q)
    q.set_defaults(func=cmd_metrics_export)

    p = sub.add_parser("compare", help="runs side by side: the config keys that differ (resolved.toml) and the "
                                       "outcome metrics")
    p.add_argument("runs", nargs="+", metavar="RUN", help=run_help)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_runs_root_args(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("config", help="inspect configuration")
    csub = p.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    q = csub.add_parser("show", help="the resolved config and where each value came from")
    q.add_argument("spec")
    q.add_argument("--site", default=DEFAULT_SITE)
    q.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE")
    q.add_argument("--toml", action="store_true", help="print resolved.toml instead of the provenance table")
    q.set_defaults(func=cmd_config_show)
    q = csub.add_parser("explain", help="describe a config key (e.g. actor.clip_ratio_c, site.slurm.partition)")
    q.add_argument("key")
    q.set_defaults(func=cmd_config_explain)

    p = sub.add_parser("import-verl", help="translate a verl command line (python3 -m verl.trainer.main_ppo ...) or "
                                           "verl YAML into an exp.toml; reports every key not translated (docs/verl.md)")
    p.add_argument("input", nargs="?", help="shell script / command line file, verl YAML file, or - for stdin")
    p.add_argument("-o", "--out", default="exp.toml", help="experiment spec to write (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--name", default=None, help="experiment name (default: trainer.experiment_name, else the input's "
                                                "file name)")
    p.add_argument("--table", action="store_true", help="print the verl key mapping (docs/verl.md) and exit")
    p.set_defaults(func=cmd_import_verl)

    p = sub.add_parser("tools", help="project tools")
    tsub = p.add_subparsers(dest="tools_command", required=True, metavar="TOOL")
    q = tsub.add_parser("make-model", help="build the tiny offline model, tokenizer and arithmetic data (idempotent: "
                                           "returns at once when the outputs hold a build with the same settings)")
    q.add_argument("--out", default="artifacts/tiny-arith/model",
                   help="model directory, Hugging Face layout (default: %(default)s)")
    q.add_argument("--data-out", default="artifacts/tiny-arith/data",
                   help="directory of train.parquet and val.parquet, '' for none (default: %(default)s)")
    q.add_argument("--seed", type=int, default=0, help="seed of the model, its warm start and the data (default: 0)")
    q.add_argument("--train-size", type=int, default=4096, help="rows of train.parquet (default: 4096)")
    q.add_argument("--val-size", type=int, default=512, help="rows of val.parquet (default: 512)")
    q.add_argument("--max-operand", type=int, default=None, help="task difficulty (default: the library's)")
    q.add_argument("--force", action="store_true", help="rebuild even when up to date")
    q.add_argument("--json", action="store_true", help="print the whole build record (hpcppo_tiny.json) as JSON")
    q.set_defaults(func=cmd_make_model)
    return parser


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    """verl key names accepted under their hpcppo names: one line on stderr, like the errors."""
    from hpcppo.config.verl import VerlNameWarning

    if issubclass(category, VerlNameWarning):
        print(f"hpcppo: warning: {message}", file=sys.stderr)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.showwarning = _show_warning
    try:
        return int(args.func(args) or 0)
    except HpcppoError as exc:
        _err(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        _err("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
