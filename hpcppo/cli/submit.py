"""Commands that make and start runs: compile, submit, preflight, resume (through :mod:`hpcppo.launch.jobs`);
``--wait`` and ``--follow`` report through :mod:`hpcppo.analysis`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hpcppo.analysis.follow import follow
from hpcppo.analysis.summary import format_start_end, start_end
from hpcppo.cli.common import err, runs_root
from hpcppo.errors import ConfigError
from hpcppo.launch import jobs, status
from hpcppo.launch.statustext import state_text
from hpcppo.rundir import RunDir


def cmd_compile(args: argparse.Namespace) -> int:
    crun = jobs.compile_run(Path(args.spec), args.site, args.override, runs_root=args.runs_root,
                            check_paths=not args.no_check_paths)
    if not args.quiet:
        sys.stdout.write(crun.script)
    print(f"# run directory: {crun.run.path}", file=sys.stderr)
    return 0


def _submit_and_report(crun: Any, args: argparse.Namespace) -> int:
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
    last: dict[str, tuple[str, str | None]] = {}

    def echo(st: status.JobStatus) -> None:
        key = (st.state, st.reason)
        if key != last.get("key"):
            print(f"  {state_text(st.state, st.reason)}", flush=True)
            last["key"] = key

    if following:
        st = follow(crun.run)
        if st is None:  # detached with Ctrl-C: the job goes on
            return 0
    else:
        st = status.wait_for(crun.run, echo=echo)
    if crun.compiled.job.kind == "train":
        print(format_start_end(start_end(crun.run.path)))
    if st.state not in ("COMPLETED", "PAUSED"):
        print(f"  logs: {crun.run.logs}", file=sys.stderr)
    return 0 if st.state in ("COMPLETED", "PAUSED") else 1


def cmd_submit(args: argparse.Namespace) -> int:
    if args.dry_run and (args.wait or args.follow):
        flag = "--follow" if args.follow else "--wait"
        raise ConfigError(f"--dry-run stops before submitting: {flag} would have no job to watch; drop one of them")
    crun = jobs.compile_run(Path(args.spec), args.site, args.override, runs_root=args.runs_root,
                            check_paths=not args.no_check_paths)
    return _submit_and_report(crun, args)


def cmd_preflight(args: argparse.Namespace) -> int:
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
        err(f"the preflight job left no report; see {crun.run.logs}")
        return 1
    return rc


def cmd_resume(args: argparse.Namespace) -> int:
    run = RunDir.open(runs_root(args), args.run)
    job_id = jobs.resume_run(run)
    print(f"resubmitted {run.run_id} as job {job_id}; it continues from its newest committed checkpoint")
    if not args.wait:
        return 0
    st = status.wait_for(run)
    print(f"  {state_text(st.state, st.reason)}")
    print(format_start_end(start_end(run.path)))
    return 0 if st.state in ("COMPLETED", "PAUSED") else 1
