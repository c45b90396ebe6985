"""``hpcppo follow RUN`` and ``hpcppo submit --follow``: watch a job live until it ends, or until Ctrl-C.

What it shows: the scheduler's state (with the pending reason) until training starts, then the training steps
(step/total, elapsed, ETA, reward, KL, kl_coef, tokens/s), read from the run's HDF5 log while the job writes
it, and the run's events (rollbacks, kl_coef raised, pauses, hangs ...) as they happen. On a terminal this is a
rich progress bar with the events printed above it; otherwise (a pipe, a CI log) one plain line per state
change, per logged step and per event.

Ctrl-C detaches: this process only reads, so leaving it never touches the job. (A local job's controller
runs in a session of its own, so the terminal's SIGINT never reaches it: ``launch.submit.submit_local``.)

Costs: one ``stat`` of the metric files per poll; the log is read again only when a file changed; the
scheduler is asked every ``status_every_s`` (Slurm: one ``sacct``, as ``--wait`` does).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pandas as pd

from hpcppo.analysis.logs import last_value, number_text, total_steps
from hpcppo.errors import HpcppoError, RunRecordError, RunStateError
from hpcppo.launch import status
from hpcppo.launch.status import JobStatus
from hpcppo.launch.statustext import state_text
from hpcppo.metrics import events as load_run_events
from hpcppo.metrics import load
from hpcppo.rundir import metric_names
from hpcppo.rundir.paths import RunPaths
from hpcppo.timefmt import format_elapsed

DETACHED = "detached from {run}: the job goes on (hpcppo follow {run} to watch it again, hpcppo cancel {run} to stop it)"
_ETA_WINDOW = 20  # rows of the current attempt the step rate is measured over
_EARLIER_EVENTS = 5  # events already in the run when following starts, shown for context
# View's reward, kl, kl_coef, tokens_per_s: the headline metrics of the "follow" view, in that order.
_SHOWN = metric_names.headline_names("follow")


# ----------------------------------------------------------------------------- what is shown (pure)
@dataclass(frozen=True)
class View:
    state: str  # "RUNNING", "PENDING (Priority)" ...
    step: int | None
    total: int | None
    elapsed_s: float | None
    eta_s: float | None
    reward: float | None
    kl: float | None
    kl_coef: float | None
    tokens_per_s: float | None
    # split placement (docs/placement.md): how far behind the actor the trained samples were, and the trainers' wait
    staleness: float | None = None
    trainer_idle_s: float | None = None


def eta_s(rows: pd.DataFrame, total: int | None) -> float | None:
    """Seconds left at the step rate of the newest attempt's last rows (``None`` until it can be measured)."""
    if total is None or not len(rows):
        return None
    step = int(rows["step"].iloc[-1])
    if step >= total:
        return 0.0
    recent = rows[rows["attempt"] == rows["attempt"].iloc[-1]].tail(_ETA_WINDOW)
    steps = int(recent["step"].iloc[-1] - recent["step"].iloc[0])
    if steps <= 0:
        return None
    per_step = float(recent["time"].iloc[-1] - recent["time"].iloc[0]) / steps
    return per_step * (total - step)


def make_view(state: str, rows: pd.DataFrame, total: int | None, elapsed_s: float | None) -> View:
    """The view of the current history ``rows`` (as :func:`hpcppo.metrics.load` returns them)."""
    step = int(rows["step"].iloc[-1]) if len(rows) else None
    reward, kl, kl_coef, tokens_per_s = (last_value(rows, c) for c in _SHOWN)
    return View(state, step, total, elapsed_s, eta_s(rows, total), reward, kl, kl_coef, tokens_per_s,
                staleness=last_value(rows, "rollout/staleness_mean"),
                trainer_idle_s=last_value(rows, "time/trainer_idle_s"))


def clock(seconds: float | None) -> str:
    """``H:MM:SS`` as ``hpcppo status`` writes it (never below 0), ``-`` when unknown."""
    return format_elapsed(None if seconds is None else max(0.0, seconds))


def metrics_text(v: View) -> str:
    split = "" if v.staleness is None else \
        f"  staleness {number_text(v.staleness)}  trainer idle {number_text(v.trainer_idle_s)} s"
    return (f"reward {number_text(v.reward)}  kl {number_text(v.kl)}  kl_coef {number_text(v.kl_coef)}  "
            f"tok/s {number_text(v.tokens_per_s, ',.0f')}{split}")


def steps_text(v: View) -> str:
    total = "?" if v.total is None else str(v.total)
    return f"step {'-' if v.step is None else v.step}/{total}"


def plain_line(v: View) -> str:
    """One line of the plain (not a terminal) output for the newest step."""
    return f"  {steps_text(v)}  elapsed {clock(v.elapsed_s)}  eta {clock(v.eta_s)}  {metrics_text(v)}"


def event_line(event: dict[str, Any]) -> str:
    step = "-" if pd.isna(event.get("step")) else int(event["step"])
    return f"  event at step {step}: {event.get('kind', '?')}: {event.get('message', '')}"


# ----------------------------------------------------------------------------- reading the run
class RunReader:
    """The run's current history and new events, read again only when a file changed."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.rows = pd.DataFrame({"step": pd.Series(dtype="int64")})
        self._signature: tuple = ()
        self._shown: Counter = Counter()
        self._events = pd.DataFrame()

    def _stat(self) -> tuple:
        paths = RunPaths(self.run_dir)
        files = [*paths.attempt_files().values(), paths.events]
        sig = []
        for f in files:
            try:
                st = f.stat()
            except OSError:
                continue
            sig.append((f.name, st.st_size, st.st_mtime_ns))
        return tuple(sig)

    def refresh(self) -> bool:
        """Read the log again if a file changed; True when it did."""
        sig = self._stat()
        if sig == self._signature:
            return False
        self.rows = load(self.run_dir)
        self._events = load_run_events(self.run_dir)
        self._signature = sig
        return True

    @staticmethod
    def _key(event: dict[str, Any]) -> tuple:
        # An action is in the HDF5 log a moment before it is in events.jsonl: the same kind, step and message.
        step = None if pd.isna(event.get("step")) else int(event["step"])
        return (event.get("kind"), step, str(event.get("message", ""))[:200])

    def new_events(self) -> list[dict[str, Any]]:
        """Events not returned before, oldest first."""
        seen: Counter = Counter()
        out = []
        for event in self._events.to_dict("records"):
            key = self._key(event)
            seen[key] += 1
            if seen[key] > self._shown[key]:
                self._shown[key] += 1
                out.append(event)
        return out


# ----------------------------------------------------------------------------- display
class PlainDisplay:
    def __init__(self, out: TextIO):
        self.out = out
        self._state: str | None = None
        self._row: tuple[int, int] | None = None

    def __enter__(self) -> PlainDisplay:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def show(self, view: View, rows: pd.DataFrame, events: list[dict[str, Any]], final: bool = False) -> None:
        if view.state != self._state and not final:
            self.print(f"  {view.state}")
        for event in events:
            self.print(event_line(event))
        self._rows(view, rows)
        if view.state != self._state and final:  # the last word, after the last rows
            self.print(f"  {view.state}")
        self._state = view.state

    def _rows(self, view: View, rows: pd.DataFrame) -> None:
        if not len(rows):
            return
        attempt, seq = rows["attempt"].to_numpy(dtype=np.int64), rows["seq"].to_numpy(dtype=np.int64)
        if self._row is None:
            new = np.arange(len(rows))
        else:
            a, q = self._row
            new = np.flatnonzero((attempt > a) | ((attempt == a) & (seq > q)))
        if len(new) > 1:  # rows logged since the last look, but the newest: their own values, no clock
            steps = rows["step"].to_numpy()
            so_far = rows.reindex(columns=list(_SHOWN)).ffill().to_numpy(dtype=np.float64)  # each row's last values
            for i in new[:-1]:
                values = (None if np.isnan(x) else float(x) for x in so_far[i])
                earlier = View(view.state, int(steps[i]), view.total, None, None, *values)
                self.print(f"  {steps_text(earlier)}  {metrics_text(earlier)}")
        if len(new):
            self.print(plain_line(view))
            self._row = (int(attempt[-1]), int(seq[-1]))

    def print(self, text: str) -> None:
        print(text, file=self.out, flush=True)


class RichDisplay:
    """A progress bar over the steps and a line of metrics below it; events are printed above."""

    def __init__(self, out: TextIO, force_terminal: bool | None = None):
        from rich.console import Console, Group
        from rich.live import Live
        from rich.progress import BarColumn, Progress, TextColumn
        from rich.text import Text

        self.console = Console(file=out, force_terminal=force_terminal)
        bar = BarColumn(bar_width=32, complete_style="green", finished_style="green", pulse_style="yellow")
        self.progress = Progress(TextColumn("{task.description}"), bar,
                                 TextColumn("{task.fields[steps]}"), TextColumn("{task.fields[times]}"),
                                 console=self.console, auto_refresh=False)
        self.task = self.progress.add_task("", total=None, steps="", times="")
        self.metrics = Text("")
        self.live = Live(Group(self.progress, self.metrics), console=self.console, refresh_per_second=4)

    def __enter__(self) -> RichDisplay:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.__exit__(*exc)

    def show(self, view: View, rows: pd.DataFrame, events: list[dict[str, Any]], final: bool = False) -> None:
        from rich.markup import escape

        for event in events:
            step = "-" if pd.isna(event.get("step")) else int(event["step"])
            self.console.print(f"[bold]step {step}[/] [magenta]{escape(str(event.get('kind')))}[/]: "
                               f"{escape(str(event.get('message', '')))}", highlight=False)
        color = {"RUNNING": "green", "COMPLETED": "green", "PENDING": "yellow"}.get(view.state.split()[0], "red")
        times = f"{clock(view.elapsed_s)} elapsed" + (f", ETA {clock(view.eta_s)}" if view.eta_s is not None else "")
        total = view.total if view.step is not None else None  # a pulsing bar until the first row
        self.progress.update(self.task, description=f"[{color}]{escape(view.state)}[/]", total=total,
                             completed=view.step or 0, steps=steps_text(view), times=times)
        self.metrics.plain = f"  {metrics_text(view)}" if view.step is not None else ""
        self.live.refresh()


# ----------------------------------------------------------------------------- the loop
def follow(run: Any, *, out: TextIO | None = None, live: bool | None = None, poll_s: float = 1.0,
           status_every_s: float = 2.0, unknown_grace_s: float = 300.0,
           get_status: Callable[[Any], JobStatus] | None = None) -> JobStatus | None:
    """Show ``run`` (a :class:`~hpcppo.rundir.RunDir`) until its job reaches a final state.

    Args:
        out: where to write (default stdout).
        live: a rich live display (default: when ``out`` is a terminal), else plain lines.
        get_status: the status function (default :func:`hpcppo.launch.status.run_status`).

    Returns:
        The final status, or ``None`` when Ctrl-C detached (the detach line is printed on stderr).

    Raises:
        RunStateError: the run was never submitted.
        RunRecordError: its ``run.json`` cannot be read (truncated, not a run record): which job to follow is
            unknown, and no final state could ever be seen.
    """
    out = out or sys.stdout
    get_status = get_status or status.run_status
    st = get_status(run)
    _refuse_unreadable(st)
    if st.state == "NOT_SUBMITTED":
        raise RunStateError(f"run {run.run_id} was never submitted; nothing to follow",
                            hint=f"hpcppo resume {run.run_id} submits it")
    reader = RunReader(run.path)
    total = total_steps(run)
    live = out.isatty() if live is None else live
    display = RichDisplay(out, force_terminal=True if live and not out.isatty() else None) if live else PlainDisplay(out)
    try:
        with display:
            return _loop(run, reader, display, st, total, poll_s, status_every_s, unknown_grace_s, get_status)
    except KeyboardInterrupt:
        print(DETACHED.format(run=run.run_id), file=sys.stderr, flush=True)
        return None


def _refuse_unreadable(st: JobStatus) -> None:
    if st.state == "UNREADABLE":
        raise RunRecordError(f"{st.reason or 'run.json cannot be read'}; nothing to follow",
                             hint=f"hpcppo status {st.run_id} shows what is known")


def _loop(run: Any, reader: RunReader, display: Any, st: JobStatus, total: int | None, poll_s: float,
          status_every_s: float, unknown_grace_s: float, get_status: Callable[[Any], JobStatus]) -> JobStatus:
    reader.refresh()
    earlier = reader.new_events()
    if len(earlier) > _EARLIER_EVENTS and isinstance(display, PlainDisplay):
        display.print(f"  ({len(earlier) - _EARLIER_EVENTS} earlier events: hpcppo status {run.run_id})")
    events = earlier[-_EARLIER_EVENTS:]
    asked = time.monotonic()
    unknown_since: float | None = None
    while True:
        now = time.monotonic()
        elapsed = st.elapsed_s
        if elapsed is not None and st.state == "RUNNING":
            elapsed += now - asked  # between two questions to the scheduler
        final = st.final
        if final:
            reader.refresh()  # the rows written just before the job ended
            events += reader.new_events()
        display.show(make_view(state_text(st.state, st.reason), reader.rows, total, elapsed), reader.rows, events, final)
        if final:
            return st
        unknown_since = (unknown_since or now) if st.state == "UNKNOWN" else None
        if unknown_since is not None and now - unknown_since > unknown_grace_s:
            return st
        time.sleep(poll_s)
        try:
            reader.refresh()
        except HpcppoError:
            pass  # a log that cannot be read just now (a new attempt's file being created): try at the next poll
        events = reader.new_events()
        if time.monotonic() - asked >= status_every_s:
            st, asked = get_status(run), time.monotonic()
            _refuse_unreadable(st)  # run.json damaged while following: stop, it will not say when the job ends
