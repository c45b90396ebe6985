"""events.jsonl: strict JSON lines, whole lines under concurrent appenders, torn lines and missing files."""

from __future__ import annotations

import json
import math
import multiprocessing
import subprocess
import sys

import pytest

from hpcppo.rundir import events
from hpcppo.rundir.events import EVENTS_FILE, append_event, read_events


def _lines(run_dir):
    return (run_dir / EVENTS_FILE).read_text().splitlines()


def test_record_fields_and_returned_record(tmp_path):
    rec = append_event(tmp_path, kind="hang", step=12, source="monitor", message="no row for 700 s", attempt=1,
                       seconds_since_row=700.5, threshold_s=600.0)
    assert list(rec)[:6] == ["time", "kind", "step", "attempt", "source", "message"]
    assert rec["kind"] == "hang" and rec["step"] == 12 and rec["attempt"] == 1 and rec["source"] == "monitor"
    assert rec["time"].endswith("+00:00")  # ISO 8601, UTC
    assert read_events(tmp_path) == [rec]
    assert json.loads(_lines(tmp_path)[0]) == rec


def test_non_finite_values_are_strings_and_the_line_is_strict_json(tmp_path):
    append_event(tmp_path, kind="watchdog.restart_critic", step=3, source="watchdog",
                 value=float("nan"), hi=math.inf, lo=-math.inf, nested={"x": [1.0, float("nan")]})
    line = _lines(tmp_path)[0]
    assert "NaN" not in line and "Infinity" not in line
    rec = json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in {line}"))
    assert (rec["value"], rec["hi"], rec["lo"], rec["nested"]) == ("nan", "inf", "-inf", {"x": [1.0, "nan"]})


def test_numpy_like_scalars_and_paths_are_plain_values(tmp_path):
    class Scalar:  # what numpy and torch scalars look like, without importing them
        def __init__(self, v):
            self.v = v

        def item(self):
            return self.v

    rec = append_event(tmp_path, kind="x", step=None, source="trainer", value=Scalar(float("inf")), path=tmp_path,
                       other=object)
    assert rec["value"] == "inf" and rec["path"] == str(tmp_path) and rec["other"] == str(object)


@pytest.mark.parametrize("kwargs, match", [
    ({"kind": "Hang"}, "event kind 'Hang' must match"),
    ({"kind": ""}, "event kind '' must match"),
    ({"source": "cli"}, "event source 'cli' is not one of watchdog, control, monitor, trainer"),
    ({"time": "yesterday"}, r"detail name\(s\) \['time'\] are reserved"),
])
def test_invalid_records_are_refused_and_nothing_is_written(tmp_path, kwargs, match):
    args = {"kind": "hang", "step": 1, "source": "monitor"} | kwargs
    with pytest.raises(ValueError, match=match):
        append_event(tmp_path, **args)
    assert not (tmp_path / EVENTS_FILE).exists()


def test_step_and_attempt_must_be_integers(tmp_path):
    with pytest.raises(TypeError, match="event step must be an int or None"):
        append_event(tmp_path, kind="hang", step="3", source="monitor")
    with pytest.raises(TypeError, match="event attempt must be an int or None"):
        append_event(tmp_path, kind="hang", step=3, source="monitor", attempt=True)


def test_missing_file_reads_as_no_events(tmp_path):
    assert read_events(tmp_path) == []
    assert read_events(tmp_path / "no-such-run", kinds=["hang"], last=3) == []


def test_kinds_and_last_filters(tmp_path):
    for i, kind in enumerate(["hang", "trainer_dead", "hang", "watchdog.pause", "hang"]):
        append_event(tmp_path, kind=kind, step=i, source="monitor")
    assert [e["step"] for e in read_events(tmp_path, kinds=["hang"])] == [0, 2, 4]
    assert [e["step"] for e in read_events(tmp_path, kinds="hang", last=2)] == [2, 4]
    assert [e["step"] for e in read_events(tmp_path, last=1)] == [4]
    assert read_events(tmp_path, last=0) == []
    with pytest.raises(ValueError, match="last must be >= 0"):
        read_events(tmp_path, last=-1)


def test_a_torn_last_line_is_skipped_and_the_next_append_starts_a_fresh_line(tmp_path):
    append_event(tmp_path, kind="hang", step=1, source="monitor")
    with open(tmp_path / EVENTS_FILE, "ab") as f:
        f.write(b'{"time":"2026-01-01T00:00:00+00:00","kind":"tr')  # a writer that died mid-line
    assert [e["step"] for e in read_events(tmp_path)] == [1]
    append_event(tmp_path, kind="hang", step=2, source="monitor")
    assert [e["step"] for e in read_events(tmp_path)] == [1, 2]
    assert len(_lines(tmp_path)) == 3  # the fragment keeps a line of its own


def test_garbage_lines_and_non_objects_are_skipped(tmp_path):
    (tmp_path / EVENTS_FILE).write_bytes(b'[1, 2]\n\xff\xfe\n\n{"kind": "ok", "step": 1}\nnull\n')
    assert read_events(tmp_path) == [{"kind": "ok", "step": 1}]


def _appender(run_dir: str, who: int, count: int) -> None:
    for i in range(count):
        # ~1.5 KB lines: more than one small write would be needed if the writer split them
        append_event(run_dir, kind="concurrent", step=i, source="monitor", who=who, pad="x" * (1500 + who))


def test_concurrent_appenders_in_several_processes_write_only_whole_lines(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_appender, args=(str(tmp_path), who, 150)) for who in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    # A blank line may appear: an appender that looks at the last byte while another's write is being copied
    # in sees no newline yet and starts its line with one (harmless; readers skip blank lines).
    lines = [line for line in _lines(tmp_path) if line]
    assert len(lines) == 6 * 150
    records = [json.loads(line) for line in lines]  # every line parses: no interleaved bytes
    for who in range(6):
        mine = [r["step"] for r in records if r["who"] == who]
        assert mine == list(range(150))  # each appender's lines in its own order, none lost
        assert all(len(r["pad"]) == 1500 + r["who"] for r in records)


def test_module_imports_no_numpy_h5py_or_torch():
    code = ("import sys, hpcppo.rundir.events; "
            "print(sorted(m for m in ('numpy', 'h5py', 'torch', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert events.SOURCES == ("watchdog", "control", "monitor", "trainer")


def _written_kinds() -> set[str]:
    """Every kind the code names: the module's kind constants and ``watchdog.<action>``."""
    constants = {v for k, v in vars(events).items() if k.isupper() and isinstance(v, str)
                 and k not in ("EVENTS_FILE", "WATCHDOG_PREFIX")}
    return constants | {events.watchdog_kind(a) for a in events.WATCHDOG_ACTIONS}


def test_watchdog_actions_are_the_rules_actions_in_precedence_order():
    from hpcppo import rule_actions
    from hpcppo.config.watchdog import RULE_ACTIONS
    from hpcppo.watchdog import PRECEDENCE

    assert events.WATCHDOG_ACTIONS == PRECEDENCE == ("pause", "requeue", "rollback", "restart_critic",
                                                     "raise_kl_coef", "set_grad_clip")
    assert set(events.WATCHDOG_ACTIONS) == set(RULE_ACTIONS)
    assert [events.watchdog_kind(a) for a in PRECEDENCE] == [rule_actions.lookup(a).event_kind for a in PRECEDENCE]


def test_the_views_table_names_only_kinds_that_are_written():
    """No entry for a kind nothing writes (the old lists had "stop" and "resumed")."""
    tails = {events.kind_tail(k) for k in _written_kinds()}
    assert [s.tail for s in events.SHOWN if s.tail not in tails] == []
    assert len({s.tail for s in events.SHOWN}) == len(events.SHOWN)
    for s in events.SHOWN:
        assert s.views <= set(events.EVENT_VIEWS) and s.views, s
        assert (s.mark is not None) == ("plot" in s.views) and s.mark in (None, *events.PLOT_MARKS), s


def test_what_each_view_shows():
    """The summary lists stops, resumes, watchdog actions and the monitor's findings; compare counts actions and
    stops (not resumes or preemptions); the plot marks rollbacks, stops and resumes."""
    actions = set(events.WATCHDOG_ACTIONS)
    assert events.shown_in("summary") == actions | {"paused", "preempted", "resume", "hang", "trainer_dead",
                                                    "suppressed", "rearmed", "mismatch"}
    assert events.shown_in("compare") == actions | {"paused", "hang", "trainer_dead", "mismatch"}
    marks = {k: events.plot_mark(k) for k in ("watchdog.rollback", "control.rollback", "watchdog.pause", "paused",
                                              "preempted", "requeue", "watchdog.requeue", "resume", "hang",
                                              "watchdog.raise_kl_coef", "checkpoint.corrupt")}
    assert marks == {"watchdog.rollback": "rollback", "control.rollback": "rollback", "watchdog.pause": "pause",
                     "paused": "pause", "preempted": "pause", "requeue": "pause", "watchdog.requeue": "pause",
                     "resume": "resume", "hang": None, "watchdog.raise_kl_coef": None, "checkpoint.corrupt": None}
    with pytest.raises(ValueError, match="unknown view 'follow'"):
        events.shown_in("follow")


def test_the_analysis_views_take_their_kinds_from_the_table():
    from hpcppo.analysis import compare, plot, summary

    assert summary.NOTABLE == events.shown_in("summary")
    assert compare._WATCHDOG_KINDS == events.shown_in("compare")
    assert list(plot.MARKS) == list(events.PLOT_MARKS)
