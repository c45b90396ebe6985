"""A few-line summary of a run's metric log: where it started, where it ended. No torch import."""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

from hpcppo.metrics.reader import load, metric_files


def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def summarize(run: str | os.PathLike[str], *, window: int = 3) -> dict[str, Any]:
    """Start/end means (over ``window`` steps) of the headline metrics, validation before/after, wall time."""
    if not metric_files(run):
        return {"steps": 0}
    df = load(run)
    train = df[df["step"] > 0] if "step" in df else df
    out: dict[str, Any] = {"steps": int(train["step"].max()) if len(train) else 0,
                           "attempts": sorted({int(a) for a in df["attempt"]})}
    for key in ("reward/mean", "score/mean", "kl/actor_ref", "kl/coef", "response/length_mean"):
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
        from hpcppo.rundir.events import read_events

        kinds = Counter(e.get("kind", "?") for e in read_events(run))
        if kinds:
            out["events"] = dict(sorted(kinds.items()))
    return out


def format_summary(summary: dict[str, Any]) -> str:
    if not summary.get("steps"):
        return "no metrics recorded"
    lines = [f"{summary['steps']} steps, attempts {summary['attempts']}"
             + (f", {summary['wall_s']:.0f} s from first to last row" if "wall_s" in summary else "")
             + (f", median step {summary['step_time_s']:.2f} s" if "step_time_s" in summary else "")]
    for key in ("reward/mean", "score/mean", "kl/actor_ref", "kl/coef", "response/length_mean"):
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
