"""``hpcppo metrics summary``: a run at a glance, from its metric log, its events and its resolved.toml. No torch.

Per headline metric (those the run logged): the last value, an exponential moving average (weight
:data:`SMOOTH` on the past, bias-corrected as TensorBoard does, so a short run is not pulled towards 0), the
best value and its step where "best" has a direction (highest reward, lowest step time), and the range. All of
these are over the current history: a branch abandoned by a rollback and steps a later attempt re-did are
left out.

The first non-finite value is looked for in every row, abandoned branches included (the NaN that made the
watchdog roll back lives on the abandoned branch). +-inf always counts. NaN is written both for a value that was
NaN and for a metric not logged at that step; the log records which (``/logged``, docs/metrics.md), so a NaN
counts exactly where the row logged the metric. In files written before that record existed a NaN counts only
where the metric was expected: after its first logged value, in a metric logged step after step (``val/*``,
``time/checkpoint_s`` and any metric never logged at two rows in a row are sparse: for them only +-inf counts),
except in a row that logged sparse metrics only (validation before training, step 0).
"""

from __future__ import annotations

import datetime as _dt
import math
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hpcppo.analysis.targets import Target, damage_error, no_rows_error, resolved_data, total_steps
from hpcppo.metrics import events as load_run_events
from hpcppo.metrics import load, load_with_logged, metric_files
from hpcppo.metrics.schema import UnknownColumnError
from hpcppo.rundir import metric_names
from hpcppo.rundir.events import kind_tail, read_events, shown_in
from hpcppo.timefmt import format_elapsed

SMOOTH = 0.9
#: Event kinds (matched on their last dotted part) listed one by one; the rest are only counted.
NOTABLE = shown_in("summary")
_SPARSE_NAMES = ("time/checkpoint_s",)
_SPARSE_PREFIXES = ("val/",)
LAST_EVENTS = 10


BLOCK_ROWS = 1 << 16  # rows scanned at a time: the bool temporaries stay small whatever the log's length


def ema(values: np.ndarray, weight: float = SMOOTH) -> np.ndarray:
    """The bias-corrected exponential moving average (TensorBoard's smoothing) at each of ``values``:
    ``sum(w^k x[i-k]) / sum(w^k)`` over ``k <= i``, so the first values are not pulled towards 0."""
    out = np.empty(len(values))
    num = den = 0.0
    for i, v in enumerate(np.asarray(values, dtype=np.float64).tolist()):
        num = weight * num + v
        den = weight * den + 1.0
        out[i] = num / den
    return out


def ema_last(values: np.ndarray, weight: float = SMOOTH) -> float:
    """:func:`ema` of ``values`` (NaNs skipped) at its last value. Only the last values count (``w^k`` < 1e-18
    beyond them), so only they are read, from the end."""
    horizon = int(math.ceil(math.log(1e-18) / math.log(weight))) if 0.0 < weight < 1.0 else 1
    tail = np.zeros(0)
    n = len(values)
    span = 4 * horizon
    while True:
        window = values[max(0, n - span):]
        tail = window[~np.isnan(window)]
        if tail.size >= horizon or span >= n:
            break
        span *= 4
    if tail.size == 0:
        return math.nan
    return float(ema(tail[-horizon:], weight)[-1])


def metric_stats(frame: pd.DataFrame, names: Sequence[str], goals: Sequence[str | None]) -> dict[str, dict[str, Any]]:
    """Per name (one pass over a ``(rows, len(names))`` array): last value and its step, smoothed, best (in the
    direction of its goal) and its step, min, max and how many rows logged it. Names never logged are left out."""
    if not len(names) or not len(frame):
        return {}
    values = np.ascontiguousarray(frame[list(names)].to_numpy(dtype=np.float64).T)  # a metric per row: fast scans
    steps = frame["step"].to_numpy()
    out: dict[str, dict[str, Any]] = {}
    for name, goal, v in zip(names, goals, values):
        logged = ~np.isnan(v)
        count = int(np.count_nonzero(logged))
        if not count:
            continue
        last = len(v) - 1 - int(np.argmax(logged[::-1]))
        finite = np.isfinite(v)
        has_finite = bool(finite.any())
        lo = int(np.argmin(np.where(finite, v, np.inf))) if has_finite else None
        hi = int(np.argmax(np.where(finite, v, -np.inf))) if has_finite else None
        best = (hi if goal == "max" else lo) if goal else None
        out[name] = {"last": float(v[last]), "last_step": int(steps[last]), "smoothed": ema_last(v), "goal": goal,
                     "best": None if best is None else float(v[best]),
                     "best_step": None if best is None else int(steps[best]),
                     "min": None if lo is None else float(v[lo]), "max": None if hi is None else float(v[hi]),
                     "logged": count}
    return out


def _dense(columns: Sequence[str], values: np.ndarray, current: np.ndarray) -> np.ndarray:
    """Per column: logged step after step on the current history (see the module docstring)."""
    count = np.zeros(len(columns), np.int64)
    consecutive = np.zeros(len(columns), bool)
    previous = None  # the last current row's "logged" of the block before
    for a in range(0, len(values), BLOCK_ROWS):
        logged = ~np.isnan(values[a:a + BLOCK_ROWS][current[a:a + BLOCK_ROWS]])
        if not len(logged):
            continue
        count += logged.sum(axis=0)
        consecutive |= (logged[1:] & logged[:-1]).any(axis=0)
        if previous is not None:
            consecutive |= previous & logged[0]
        previous = logged[-1]
    named = np.array([c in _SPARSE_NAMES or c.startswith(_SPARSE_PREFIXES) for c in columns], dtype=bool)
    return ~(named | ((count >= 2) & ~consecutive))


def first_nonfinite(every: pd.DataFrame, columns: Sequence[str],
                    logged: np.ndarray | None = None) -> dict[str, Any] | None:
    """The first row (in logging order, every row) with a non-finite value, per the module docstring.

    ``logged``: which cells of ``every[columns]`` were logged (:func:`hpcppo.metrics.load_with_logged`: 1, 0, or
    -1 where the file did not record it); None: not known for any row (the guess of the module docstring)."""
    if not len(every) or not columns:
        return None
    recorded = logged  # (the loop below names the cells it sees logged ``logged``)
    values = every[list(columns)].to_numpy(dtype=np.float64)  # a view of the frame's block, no copy
    current = every["current"].to_numpy() if "current" in every else np.ones(len(every), bool)
    dense = _dense(columns, values, current)
    never = np.iinfo(np.int64).max
    first_logged = np.full(len(columns), never)  # row of each column's first value
    first: tuple[int, np.ndarray] | None = None
    bad_rows = 0
    for a in range(0, len(values), BLOCK_ROWS):
        block = values[a:a + BLOCK_ROWS]
        nan = np.isnan(block)
        bad = np.isinf(block)
        known = np.zeros(block.shape, bool)
        if recorded is not None:
            marks = recorded[a:a + BLOCK_ROWS]
            known = marks >= 0
            bad |= nan & (marks == 1)  # a real NaN: the row logged it
        if dense.any() and not known.all():
            logged = ~nan
            new = (first_logged == never) & logged.any(axis=0)
            first_logged[new] = a + np.argmax(logged[:, new], axis=0)
            expected = np.arange(a, a + len(block))[:, None] > first_logged[None, :]  # after the first value
            # a row that logged only sparse metrics (validation before training) is not missing the others
            sparse_only = logged[:, ~dense].any(axis=1) & nan[:, dense].all(axis=1)
            bad |= nan & expected & dense[None, :] & ~sparse_only[:, None] & ~known
        rows = np.flatnonzero(bad.any(axis=1))
        bad_rows += rows.size
        if first is None and rows.size:
            first = (a + int(rows[0]), bad[rows[0]].copy())
    if first is None:
        return None
    r, which = first
    return {"step": int(every["step"].iloc[r]), "attempt": int(every["attempt"].iloc[r]),
            "branch": int(every["branch"].iloc[r]), "current": bool(current[r]),
            "columns": [c for j, c in enumerate(columns) if which[j]], "rows": int(bad_rows)}


def _iso(t: float) -> str | None:
    if not math.isfinite(t):
        return None
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="seconds")


def summarize_target(target: Target, *, metrics: Sequence[str] = (), locking: bool | None = None) -> dict[str, Any]:
    """The summary of one run or file as plain data (what ``--json`` prints).

    Raises:
        RunStateError: nothing logged yet (the message says whether the job is pending, never ran, ...).
        UnknownColumnError: a name in ``metrics`` is not a column of the log (with close matches).
        PathError: not a metric log, not readable, or so damaged that no row is left.
    """
    every, logged = load_with_logged(target.path, attempts="all", branches="all", locking=locking)
    if not len(every):
        raise damage_error(target, every.attrs["damaged"]) if every.attrs.get("damaged") else no_rows_error(target)
    structural = {"step", "attempt", "branch", "seq", "time", "current"}
    columns = [c for c in every.columns if c not in structural]
    for name in metrics:
        if name not in columns:
            raise UnknownColumnError(name, columns, where=target.name)
    current = every.loc[every["current"].to_numpy()]
    data = resolved_data(target)
    total = total_steps(data)
    shown = metric_names.headline("summary")
    wanted = [(h.name, h.better) for h in shown if h.name in columns]
    wanted += [(n, None) for n in metric_names.tool_columns_in(columns)]  # a multi-turn run's tool metrics
    wanted += [(n, None) for n in metrics if n not in {name for name, _ in wanted}]
    stats = metric_stats(current, [n for n, _ in wanted], [g for _, g in wanted])
    times = current["time"].to_numpy()
    ev = load_run_events(target.path, locking=locking)
    counts = ev["kind"].value_counts().sort_index().to_dict() if len(ev) else {}
    notable = ev[ev["kind"].map(lambda k: kind_tail(k) in NOTABLE)] if len(ev) else ev
    damaged = dict(every.attrs.get("damaged", {}))
    damaged.update(ev.attrs.get("damaged", {}))
    experiment: dict[str, Any] = data["experiment"] if isinstance(data.get("experiment"), dict) else {}
    return {
        "run": target.name,
        "path": str(target.path),
        "experiment": experiment.get("name"),
        "site": (data.get("site") or {}).get("name") if isinstance(data.get("site"), dict) else None,
        "steps_done": int(current["step"].max()),
        "total_steps": total,
        "rows": int(len(current)),
        "rows_left_behind": int(len(every) - len(current)),
        "attempts": sorted(int(a) for a in every["attempt"].unique()),
        "rollbacks_in_log": int(every.groupby("attempt")["branch"].max().sum()),
        "first_time": _iso(float(times.min())),
        "last_time": _iso(float(times.max())),
        "wall_s": float(times.max() - times.min()),
        "metrics": stats,
        "first_nonfinite": first_nonfinite(every, columns, logged),
        "events": {"counts": {str(k): int(v) for k, v in counts.items()},
                   "last": [{"time": _iso(float(r.time)), "step": None if pd.isna(r.step) else int(r.step),
                             "attempt": None if pd.isna(r.attempt) else int(r.attempt), "kind": r.kind,
                             "message": r.message, "source": r.source}
                            for r in notable.tail(LAST_EVENTS).itertuples()]},
        "damaged": damaged,
    }


# ----------------------------------------------------------------------------- text
def fmt(value: float | None) -> str:
    """A number in a table cell: 4 significant digits, thousands separated from 10,000 up; '-' for none."""
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if abs(value) >= 1e4:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def duration(seconds: float) -> str:
    """``H:MM:SS`` as ``hpcppo status`` writes it, to the nearest second."""
    return format_elapsed(round(seconds))


def steps_text(summary: dict[str, Any]) -> str:
    done, total = summary["steps_done"], summary["total_steps"]
    if total:
        return f"{done} of {total} steps ({100.0 * done / total:.0f}%)"
    return f"{done} steps (total unknown)"


def headline(summary: dict[str, Any]) -> str:
    attempts = summary["attempts"]
    parts = [steps_text(summary), f"attempt{'s' if len(attempts) > 1 else ''} {', '.join(map(str, attempts))}",
             f"{summary['rows']} rows" + (f" (+{summary['rows_left_behind']} left behind by rollbacks/resumes)"
                                          if summary["rows_left_behind"] else ""),
             f"wall {duration(summary['wall_s'])}"]
    if summary.get("site"):
        parts.append(f"site {summary['site']}")
    return " | ".join(parts)


def nonfinite_text(summary: dict[str, Any]) -> str:
    bad = summary["first_nonfinite"]
    if bad is None:
        return "first non-finite value: none"
    where = "" if bad["current"] else ", on an abandoned branch"
    cols = ", ".join(bad["columns"][:6]) + (f" (+{len(bad['columns']) - 6})" if len(bad["columns"]) > 6 else "")
    return (f"first non-finite value: step {bad['step']} (attempt {bad['attempt']}, branch {bad['branch']}{where}): "
            f"{cols}; {bad['rows']} row(s) with one")


def render(summary: dict[str, Any]) -> Any:
    """The rich renderable of one summary: a table of the metrics, then the non-finite and event lines."""
    from rich.console import Group, JustifyMethod
    from rich.table import Table
    from rich.text import Text

    title = Text.assemble((summary["run"], "bold"), "  ", headline(summary))
    table = Table(show_edge=False, pad_edge=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("metric", "left"), ("last", "right"), ("smoothed", "right"), ("best", "right"), ("at step", "right"),
        ("min", "right"), ("max", "right"))
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)
    for name, s in summary["metrics"].items():
        table.add_row(name, fmt(s["last"]), fmt(s["smoothed"]), fmt(s["best"]),
                      "-" if s["best_step"] is None else str(s["best_step"]), fmt(s["min"]), fmt(s["max"]))
    lines: list[Any] = [title, table, Text(nonfinite_text(summary))]
    counts = summary["events"]["counts"]
    if counts:
        lines.append(Text("events: " + ", ".join(f"{n} x {k}" for k, n in counts.items())))
        for e in summary["events"]["last"]:
            step = "-" if e["step"] is None else str(e["step"])
            lines.append(Text(f"  step {step:>6}  {e['kind']:<24} {e['message']}", overflow="ellipsis",
                              no_wrap=True))
    else:
        lines.append(Text("events: none"))
    for path, what in summary["damaged"].items():
        lines.append(Text(f"damaged: {path}: {what}", style="red"))
    return Group(*lines)


# ----------------------------------------------------------------------------- the end of a job, in a few lines
def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def start_end(run: str | os.PathLike[str], *, window: int = 3) -> dict[str, Any]:
    """What ``submit --wait`` and ``resume --wait`` print when the job ends: start/end means (over ``window``
    steps) of the headline metrics, validation before/after, wall time, the events by kind."""
    if not metric_files(run):
        return {"steps": 0}
    df = load(run)
    train = df[df["step"] > 0] if "step" in df else df
    out: dict[str, Any] = {"steps": int(train["step"].max()) if len(train) else 0,
                           "attempts": sorted({int(a) for a in df["attempt"]})}
    for key in metric_names.headline_names("end"):
        if key in train and train[key].notna().any():
            out[key] = {"start": _mean(train[key].head(window).tolist()), "end": _mean(train[key].tail(window).tolist())}
    if "val/score" in df:
        val = df[df["val/score"].notna()]
        if len(val):
            out["val/score"] = {"start": float(val["val/score"].iloc[0]), "end": float(val["val/score"].iloc[-1]),
                                "start_step": int(val["step"].iloc[0]), "end_step": int(val["step"].iloc[-1])}
    if len(df) > 1:
        out["wall_s"] = float(df["time"].max() - df["time"].min())
    if "perf/step_time_s" in train and len(train):
        out["step_time_s"] = float(train["perf/step_time_s"].median())
    if Path(run).is_dir():
        kinds = Counter(e.get("kind", "?") for e in read_events(run))
        if kinds:
            out["events"] = dict(sorted(kinds.items()))
    return out


def format_start_end(summary: dict[str, Any]) -> str:
    if not summary.get("steps"):
        return "no metrics recorded"
    lines = [f"{summary['steps']} steps, attempts {summary['attempts']}"
             + (f", {summary['wall_s']:.0f} s from first to last row" if "wall_s" in summary else "")
             + (f", median step {summary['step_time_s']:.2f} s" if "step_time_s" in summary else "")]
    for key in metric_names.headline_names("end"):
        if key in summary:
            s = summary[key]
            lines.append(f"{key:<22} {s['start']:.4g} -> {s['end']:.4g}   (mean of the first / last steps)")
    if "val/score" in summary:
        v = summary["val/score"]
        lines.append(f"{'val/score':<22} {v['start']:.4g} (step {v['start_step']}) -> {v['end']:.4g} (step {v['end_step']})")
    if summary.get("events"):
        counted = ", ".join(f"{n} x {kind}" for kind, n in summary["events"].items())
        lines.append(f"{'events':<22} {counted}   (hpcppo status RUN shows the last ones)")
    return "\n".join(lines)
