"""The text the CLI prints for a job status (:class:`hpcppo.launch.status.JobStatus`): the one-line state and
``hpcppo status RUN``'s detail. Pure: no file, no scheduler."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpcppo.launch.status import JobStatus
from hpcppo.timefmt import format_elapsed


def state_text(state: str, reason: str | None) -> str:
    """``STATE`` or ``STATE (reason)``."""
    return f"{state} ({reason})" if reason and reason not in ("None",) else state


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def format_run(st: JobStatus, attempts: Sequence[dict[str, Any]], events: Sequence[dict[str, Any]] = ()) -> str:
    """The detail of one run (``hpcppo status RUN``): its status, one line per attempt of ``run.json``, then the
    last ``events`` (watchdog actions, rollback requests, monitor findings from ``events.jsonl``)."""
    source = f"   [from {st.source}]" if st.source else ""
    lines = [f"run         {st.run_id}",
             f"site        {st.site} ({st.scheduler})",
             f"job         {st.job_id or '-'}",
             f"ranks       {st.roles or '-'}",
             f"state       {state_text(st.state, st.reason)}{source}",
             f"elapsed     {format_elapsed(st.elapsed_s)}",
             f"attempts    {st.attempts}",
             f"restarts    {_dash(st.restarts)}",
             f"checkpoint  {_dash(st.latest_checkpoint)}",
             f"directory   {st.path}"]
    if st.monitor:
        lines.append(f"monitor     {st.monitor}")
    if st.moved_from:
        lines.append(f"copied from {st.moved_from} (job.sbatch runs there; hpcppo resume renders it for here)")
    for i, a in enumerate(attempts):
        seen = f", last seen {a['state']}" if a.get("state") else ""
        lines.append(f"attempt {i}: job {a.get('job_id')} submitted {a.get('submitted_at')} ({a.get('kind', 'submit')}{seen})")
    if events:
        lines.append(f"last {len(events)} events (events.jsonl):")
        for e in events:
            step = "-" if e.get("step") is None else e["step"]
            lines.append(f"  {str(e.get('time', ''))[:19]}  step {step:>5}  {e.get('kind', '?'):<24} {e.get('message', '')}")
    return "\n".join(lines)
