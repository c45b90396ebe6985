"""``hpcppo plot``: metric curves of one or more runs, as a PNG, PDF or SVG (matplotlib, no display needed).

One panel per metric, stacked over a shared x axis; each run has its colour and a legend entry. The current
history is a solid line; a branch abandoned by a rollback (or steps an attempt re-did) is a thin dashed line of
the same colour that starts at the last step the two share, so the fork is visible. Rollbacks, pauses and
resumes are vertical lines across every panel.

x axes: ``step``; ``time`` (wall clock since the run's first row, gaps between attempts included); ``tokens``
(tokens processed so far, abandoned work included, from ``perf/tokens_per_s`` x ``perf/step_time_s``). The last
two measure what was spent, so an abandoned branch and the branch that replaced it lie side by side there.

Smoothing (``--smooth``): ``ema:A`` is an exponential moving average with weight ``A`` on the past, bias-
corrected like TensorBoard's, so the first points are not pulled towards 0; ``window:N`` a trailing mean of N
points; ``none``. With smoothing the raw values stay as a faint line underneath.

matplotlib is imported only when a figure is drawn (its object API, not pyplot: no global state, no backend).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hpcppo.analysis.summary import ema
from hpcppo.analysis.targets import Target, no_rows_error
from hpcppo.errors import ConfigError
from hpcppo.fsutil import atomic_write, require_parent_dir
from hpcppo.metrics import events as load_run_events
from hpcppo.metrics import load
from hpcppo.metrics.schema import UnknownColumnError
from hpcppo.rundir import metric_names
from hpcppo.rundir.events import PLOT_MARKS, plot_mark

X_AXES = ("step", "time", "tokens")
FORMATS = ("png", "pdf", "svg")
DEFAULT_METRICS = metric_names.headline_names("plot")
# Event kinds drawn as vertical lines: category -> (colour, line style); which kinds belong to which category is
# hpcppo.rundir.events.SHOWN (matched on a kind's last part: "watchdog.rollback" and "control.rollback" alike).
_STYLES: dict[str, tuple[str, str]] = {"rollback": ("#d62728", "--"), "pause": ("#ff7f0e", ":"), "resume": ("#2ca02c", "-.")}
MARKS: dict[str, tuple[str, str]] = {category: _STYLES[category] for category in PLOT_MARKS}
_TOKENS = ("perf/tokens_per_s", "perf/step_time_s")


@dataclass(frozen=True)
class Smoothing:
    kind: str  # "none", "ema" or "window"
    value: float = 0.0

    def apply(self, y: np.ndarray) -> np.ndarray:
        """``y`` (finite values only) smoothed."""
        if self.kind == "ema" and self.value > 0 and len(y):
            return ema(y, self.value)
        if self.kind == "window" and self.value > 1:
            return pd.Series(y).rolling(int(self.value), min_periods=1).mean().to_numpy()
        return y

    @property
    def active(self) -> bool:
        return (self.kind == "ema" and self.value > 0) or (self.kind == "window" and self.value > 1)


def parse_smooth(text: str | None) -> Smoothing:
    """``none``, ``ema:A`` with 0 <= A < 1, or ``window:N`` with N >= 1.

    Raises:
        ConfigError: anything else.
    """
    if text is None or text.strip().lower() in ("", "none", "0"):
        return Smoothing("none")
    kind, _, value = text.strip().lower().partition(":")
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if kind == "ema" and 0 <= number < 1:
        return Smoothing("ema", number)
    if kind == "window" and number >= 1 and number == int(number):
        return Smoothing("window", number)
    raise ConfigError(f"--smooth {text!r}: expected none, ema:A (0 <= A < 1, e.g. ema:0.9) or window:N (N >= 1)")


def parse_metrics(text: str | Sequence[str] | None) -> list[str]:
    """``-m a,b -m c`` as ``[a, b, c]`` (order kept, duplicates dropped); the default set when empty."""
    items = [text] if isinstance(text, str) else list(text or [])
    names: list[str] = []
    for item in items:
        for name in item.split(","):
            if name.strip() and name.strip() not in names:
                names.append(name.strip())
    return names or list(DEFAULT_METRICS)


def output_format(out: Path) -> str:
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ConfigError(f"-o {out}: unknown image format {out.suffix or '(none)'!r}",
                          hint=f"name the file .{', .'.join(FORMATS)}")
    return fmt


# ----------------------------------------------------------------------------- data
@dataclass
class Series:
    """One run's rows and marks, ready to draw."""

    label: str
    rows: pd.DataFrame  # every row in logging order, with boolean ``current`` and float ``x``
    marks: list[tuple[str, float]]  # (category, x)


def history(run: str | os.PathLike[str]) -> pd.DataFrame:
    """Every row of ``run`` (abandoned branches and re-done steps too) in logging order, with the boolean
    ``current`` column of :func:`hpcppo.metrics.load` (the row is on the current history)."""
    frame = load(run, attempts="all", branches="all")
    return frame.sort_values(["attempt", "seq"], kind="stable", ignore_index=True)


def _x_values(rows: pd.DataFrame, x: str) -> np.ndarray:
    if x == "step":
        return rows["step"].to_numpy(dtype=float)
    if x == "time":
        t = rows["time"].to_numpy(dtype=float)
        return t - t[0] if len(t) else t
    tokens = (rows[_TOKENS[0]] * rows[_TOKENS[1]]).fillna(0).to_numpy(dtype=float)
    return np.cumsum(tokens)


def _event_x(event: pd.Series, rows: pd.DataFrame, x: str) -> float | None:
    if x == "step":
        return None if pd.isna(event["step"]) else float(event["step"])
    t = rows["time"].to_numpy(dtype=float)
    if not len(t) or pd.isna(event["time"]):
        return None
    return float(np.interp(event["time"], t, rows["x"].to_numpy(dtype=float)))


def _marks(run: str | os.PathLike[str], rows: pd.DataFrame, x: str) -> list[tuple[str, float]]:
    marks: list[tuple[str, float]] = []
    for _, event in load_run_events(run).iterrows():
        category = plot_mark(str(event["kind"]))
        if category is None:
            continue
        pos = _event_x(event, rows, x)
        if pos is not None and (category, pos) not in marks:
            marks.append((category, pos))
    return marks


def load_series(runs: Sequence[Target], metrics: Sequence[str], x: str) -> list[Series]:
    """The rows of each run (:func:`~hpcppo.analysis.targets.resolve_targets`) with their x values and marks.

    Raises:
        UnknownColumnError: a metric (or, for ``x="tokens"``, a throughput column) is in no run's log.
        RunStateError: no run has a row yet (why, for the first one: not submitted, pending ...).
    """
    if x not in X_AXES:
        raise ConfigError(f"-x {x!r}: expected one of {', '.join(X_AXES)}")
    loaded = [(t.name, t.path, history(t.path)) for t in runs]
    columns: list[str] = []
    for _, _, rows in loaded:
        columns.extend(c for c in rows.columns if c not in columns)
    if not any(len(rows) for _, _, rows in loaded):
        raise no_rows_error(runs[0])
    metric_columns = [c for c in columns if c not in ("step", "attempt", "branch", "seq", "time", "current")]
    where = loaded[0][0] if len(loaded) == 1 else f"{len(loaded)} runs"
    for name in [*metrics, *(_TOKENS if x == "tokens" else ())]:
        if name not in columns:
            raise UnknownColumnError(name, metric_columns, where=where)
    series = []
    for label, path, rows in loaded:
        if not len(rows):
            continue
        rows = rows.assign(x=_x_values(rows, x))
        series.append(Series(label, rows, _marks(path, rows, x)))
    return series


# ----------------------------------------------------------------------------- drawing
def _segments(rows: pd.DataFrame) -> list[tuple[pd.DataFrame, int]]:
    """Runs of consecutive non-current rows, each led by the current rows before it that it forked from.

    Returns ``(rows, lead)`` pairs: the branch's lineage (current rows with smaller steps, then the branch) and how
    many of its first rows are that lineage; the last of those is the fork point.
    """
    current = rows["current"].to_numpy(dtype=bool)
    out = []
    start = None
    for i in range(len(rows) + 1):
        off = i < len(rows) and not current[i]
        if off and start is None:
            start = i
        elif not off and start is not None:
            seg = rows.iloc[start:i]
            before = rows.iloc[:start]
            lineage = before[before["current"] & (before["step"] < seg["step"].iloc[0])]
            out.append((pd.concat([lineage, seg]), len(lineage)))
            start = None
    return out


def _time_unit(span: float) -> tuple[float, str]:
    if span > 2 * 3600:
        return 3600.0, "h"
    if span > 2 * 60:
        return 60.0, "min"
    return 1.0, "s"


def _x_label(x: str, scale: float, unit: str) -> str:
    if x == "time":
        return f"wall time since the first row ({unit})"
    if x == "tokens":
        return "tokens processed (abandoned work included)"
    return "step"


def _draw_metric(ax: Any, s: Series, name: str, color: str, smooth: Smoothing, scale: float, first: bool) -> bool:
    """Draw one run's ``name`` on ``ax``; True when an abandoned branch was drawn. A run without the metric (another
    run of the figure has it: a run without tools has no tool metrics) draws nothing there."""
    if name not in s.rows:
        return False
    rows = s.rows[s.rows[name].notna()]
    cur = rows[rows["current"]]
    sparse = len(cur) <= 1 or len(rows) < 0.4 * len(s.rows)  # validation every N steps: points, not only a line
    xs, ys = cur["x"].to_numpy() / scale, cur[name].to_numpy(dtype=float)
    if smooth.active and len(ys) > 2 and not sparse:
        ax.plot(xs, ys, color=color, lw=0.8, alpha=0.25)
        ax.plot(xs, smooth.apply(ys), color=color, lw=1.6, label=_plain(s.label) if first else None)
    else:
        ax.plot(xs, ys, color=color, lw=1.6, marker="o" if sparse else None, ms=3.5,
                label=_plain(s.label) if first else None)
    drawn = False
    for lineage, lead in _segments(rows):
        seg_x, seg_y = lineage["x"].to_numpy() / scale, lineage[name].to_numpy(dtype=float)
        keep = slice(max(lead - 1, 0), None)
        if smooth.active and not sparse:
            ax.plot(seg_x[keep], seg_y[keep], color=color, lw=0.8, ls="--", alpha=0.25)
            seg_y = smooth.apply(seg_y)  # over the branch's own past: it leaves the smoothed line where it forked
        ax.plot(seg_x[keep], seg_y[keep], color=color, lw=1.1, ls="--", alpha=0.5, marker="o" if sparse else None, ms=3)
        drawn = True
    return drawn


def _plain(text: str) -> str:
    """``text`` drawn as typed. A title or a run's name is a label, not TeX: '$5 runs' or a file name with '$'
    must show its dollars, not fail in mathtext's parser (``--title '$\\frac{1}{0}$'`` raised ParseException), so
    every '$' is escaped and :func:`draw` turns ``text.usetex`` off (a matplotlibrc may turn it on)."""
    return text.replace("$", r"\$")


def draw(series: Sequence[Series], metrics: Sequence[str], out: Path, *, x: str = "step",
         smooth: Smoothing = Smoothing("none"), title: str | None = None, dpi: int = 100) -> Path:
    """Write the figure of ``series`` to ``out`` (format from its suffix); returns ``out``."""
    import matplotlib

    with matplotlib.rc_context({"text.usetex": False}):  # labels are plain text (_plain)
        return _draw(series, metrics, out, x=x, smooth=smooth, title=title, dpi=dpi)


def _draw(series: Sequence[Series], metrics: Sequence[str], out: Path, *, x: str, smooth: Smoothing,
          title: str | None, dpi: int) -> Path:
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fmt = output_format(out)
    span = max((float(s.rows["x"].max()) for s in series if len(s.rows)), default=0.0)
    scale, unit = _time_unit(span) if x == "time" else (1.0, "")
    fig = Figure(figsize=(8.0, 1.25 + 2.0 * len(metrics)), layout="constrained")
    axes = fig.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    colors = [f"C{i % 10}" for i in range(len(series))]
    abandoned = False
    used_marks: set[str] = set()
    for k, (ax, name) in enumerate(zip(axes, metrics)):
        for s, color in zip(series, colors):
            abandoned |= _draw_metric(ax, s, name, color, smooth, scale, first=k == 0)
            for category, pos in s.marks:
                mcolor, style = MARKS[category]
                ax.axvline(pos / scale, color=mcolor, ls=style, lw=1.0, alpha=0.8)
                used_marks.add(category)
        ax.set_ylabel(_plain(name), fontsize=9)
        ax.grid(True, alpha=0.3, lw=0.5)
        ax.tick_params(labelsize=8)
    axes[-1].set_xlabel(_x_label(x, scale, unit), fontsize=9)
    handles = [Line2D([], [], color=c, lw=1.6, label=_plain(s.label)) for s, c in zip(series, colors)]
    if abandoned:
        handles.append(Line2D([], [], color="0.4", lw=1.1, ls="--", alpha=0.6, label="abandoned branch"))
    for category in MARKS:
        if category in used_marks:
            handles.append(Line2D([], [], color=MARKS[category][0], ls=MARKS[category][1], lw=1.0, label=category))
    smoothed = f"smoothed {smooth.kind}:{smooth.value:g} (raw values faint)" if smooth.active else None
    heading = "; ".join(_plain(t) for t in (title, smoothed) if t) or None
    fig.legend(handles=handles, loc="outside upper center", ncols=min(len(handles), 4), fontsize=8, frameon=False,
               title=heading, title_fontsize=8)
    extra: dict[str, Any] = {"pil_kwargs": {"optimize": True}} if fmt == "png" else {}
    require_parent_dir(out)  # the user's path: a missing directory is reported, never made
    atomic_write(out, lambda f: fig.savefig(f, format=fmt, dpi=dpi, metadata=_metadata(fmt), **extra))
    return out


def _metadata(fmt: str) -> dict[str, Any] | None:
    """No creation date in the file: the same data makes the same bytes (a committed image does not churn)."""
    if fmt == "png":
        return {"Software": None}
    if fmt == "pdf":
        return {"CreationDate": None, "Producer": None, "Creator": None}
    if fmt == "svg":
        return {"Date": None, "Creator": None}
    return None


def plot_runs(runs: Sequence[Target], metrics: Sequence[str], out: Path, *, x: str = "step",
              smooth: str | Smoothing | None = None, title: str | None = None) -> Path:
    """Load ``runs`` (:func:`~hpcppo.analysis.targets.resolve_targets`; each labelled by its name) and draw
    ``metrics`` into ``out``."""
    output_format(out)  # a bad name fails before any file is read
    require_parent_dir(out)  # and so does a directory that is not there
    smoothing = smooth if isinstance(smooth, Smoothing) else parse_smooth(smooth)
    series = load_series(runs, metrics, x)
    return draw(series, metrics, out, x=x, smooth=smoothing, title=title)
