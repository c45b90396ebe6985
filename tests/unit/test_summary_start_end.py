"""The few-line summary printed after ``submit --wait`` / ``resume --wait``: headline metrics and the events."""

from __future__ import annotations

from hpcppo.analysis.summary import format_start_end, start_end
from hpcppo.metrics import MetricsWriter
from hpcppo.rundir.events import append_event


def test_summary_counts_the_watchdog_events_and_shows_kl_coef(tmp_path):
    with MetricsWriter(tmp_path, ["reward/mean", "kl/actor_ref", "kl/coef"], attempt=0) as w:
        for step in range(1, 7):
            w.log(step, {"reward/mean": 0.1 * step, "kl/actor_ref": 0.01 * step, "kl/coef": 0.001 * (1.5 if step > 3 else 1)})
    for step in (4, 6):
        append_event(tmp_path, kind="watchdog.raise_kl_coef", step=step, source="watchdog")
    append_event(tmp_path, kind="watchdog.rollback", step=5, source="watchdog", checkpoint=4)
    summary = start_end(tmp_path)
    assert summary["events"] == {"watchdog.raise_kl_coef": 2, "watchdog.rollback": 1}
    text = format_start_end(summary)
    assert "events                 2 x watchdog.raise_kl_coef, 1 x watchdog.rollback" in text
    assert "kl/coef                0.001 -> 0.0015" in text


def test_summary_without_events_has_no_events_line(tmp_path):
    with MetricsWriter(tmp_path, ["reward/mean"], attempt=0) as w:
        w.log(1, {"reward/mean": 0.5})
    assert "events" not in start_end(tmp_path) and "events" not in format_start_end(start_end(tmp_path))
