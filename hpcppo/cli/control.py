"""Commands that look at or act on one run's job: status, cancel, rollback (no pandas, no HDF5: ``status`` with a
run id stays quick; ``status`` alone is ``runs``)."""

from __future__ import annotations

import argparse
import json
import sys

from hpcppo.cli import dispatch
from hpcppo.cli.common import err, runs_root
from hpcppo.errors import RunRecordError
from hpcppo.launch import jobs, status
from hpcppo.launch.statustext import format_run
from hpcppo.rundir import RunDir, checkpoints, control, events


def cmd_status(args: argparse.Namespace) -> int:
    root = runs_root(args)
    if args.run is not None:  # an empty id ('' from an unset variable) is refused, not read as "every run"
        run = RunDir.open(root, args.run)
        st, attempts = status.run_detail(run)
        if st.state == "UNREADABLE":
            raise RunRecordError(str(st.reason))
        recent = events.read_events(run.path, last=10)
        damaged = _damaged_checkpoints(run, shards=args.verify)
        if args.json:
            print(json.dumps(st.to_dict() | {"attempt_records": attempts, "events": recent, "damaged_checkpoints": damaged},
                             indent=2, default=str))
        else:
            print(format_run(st, attempts, recent))
        if damaged:
            steps = ", ".join(f"step {step} ({why})" for step, why in damaged.items())
            print(f"hpcppo: warning: damaged committed checkpoint{'s' if len(damaged) > 1 else ''}: {steps}; a resume "
                  "sets it aside and starts from the newest intact one", file=sys.stderr)
        return 0
    return dispatch("seeing:cmd_runs", args)


def _damaged_checkpoints(run: RunDir, *, shards: bool) -> dict[int, str]:
    """Committed checkpoints that differ from their commit's manifest (sizes and the small files' CRC-32; every
    shard's CRC-32 with ``shards``): found now rather than when a resume reaches them."""
    root = run.checkpoints
    found = {}
    for step in checkpoints.list_committed(root):
        why = checkpoints.find_damage(checkpoints.step_dir(root, step), shards=shards)
        if why is not None:
            found[step] = why
    return found


def cmd_cancel(args: argparse.Namespace) -> int:
    run = RunDir.open(runs_root(args), args.run)
    result = jobs.cancel_run(run)
    if result["cancelled"]:
        print(f"cancel requested for job {result['job_id']} of {run.run_id} (was {result['state']})")
    else:
        print(f"job {result['job_id']} of {run.run_id} already ended ({result['state']}); nothing to cancel")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    run = RunDir.open(runs_root(args), args.run)
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
        err(f"no acknowledgement within {args.timeout:g} s; the request stays queued: {rb.request.path}")
        return 1
    outcome = dict(ack.get("outcome") or {})
    status = outcome.pop("status", "?")
    details = ", ".join(f"{k} {v}" for k, v in outcome.items())
    print(f"  {status} at {ack.get('acked', '?')}" + (f": {details}" if details else ""))
    return 0 if status == "applied" else 1
