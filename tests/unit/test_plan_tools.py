"""``hpcppo plan`` on a multi-turn run (issue 34, point 6): the tool calls' time is in the step's estimate, with the
calls per trajectory from the turn limits (4 tool turns assumed when unlimited, said in the table), and the response
budget covers every turn (the sequence stays prompt + max_response_length)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from rich.console import Console

from hpcppo.compiler import compile_config
from hpcppo.config.multi_turn import MultiTurnSection, ToolEntry
from hpcppo.sizing import report
from hpcppo.sizing.estimate import estimate
from hpcppo.sizing.steptime import UNLIMITED_TOOL_TURNS, tool_calls_per_trajectory

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "examples" / "gsm8k-qwen2.5-7b.toml"


@pytest.fixture(scope="module")
def compiled():
    return compile_config(GSM8K, "h100-cluster", check_paths=False, check_memory=False)


def _budget(compiled, **multi_turn):
    if multi_turn.get("enable"):  # a multi-turn run needs a tool
        multi_turn.setdefault("tools", [ToolEntry(class_name="hpcppo.agent.builtin.Calculator")])
    rollout = attrs.evolve(compiled.experiment.rollout, multi_turn=MultiTurnSection(**multi_turn))
    exp = attrs.evolve(compiled.experiment, rollout=rollout)
    return estimate(compiled.site, exp, compiled.plan)


def test_calls_per_trajectory_follow_the_turn_limits():
    assert tool_calls_per_trajectory(MultiTurnSection()) == (UNLIMITED_TOOL_TURNS, True)
    assert tool_calls_per_trajectory(MultiTurnSection(max_assistant_turns=6, max_user_turns=3)) == (3, False)
    assert tool_calls_per_trajectory(MultiTurnSection(max_assistant_turns=2, max_parallel_calls=3)) == (6, False)


def test_tool_time_is_in_the_step_estimate(compiled):
    single = _budget(compiled).time
    multi = _budget(compiled, enable=True, max_user_turns=3, expected_tool_s=2.0).time
    per_rank = compiled.plan.samples_per_rank
    assert single["tool_s"] == 0.0 and "tool_calls_per_trajectory" not in single
    assert multi["tool_s"] == pytest.approx(per_rank * 3 * 2.0)
    assert multi["step_s"] == pytest.approx(single["step_s"] + multi["tool_s"])
    # the response budget covers every turn: generation and the forwards are those of the single-turn run
    assert multi["generate_s"] == single["generate_s"] and multi["update_flops"] == single["update_flops"]


def test_the_table_says_when_the_turn_count_is_assumed(compiled):
    def text(budget) -> str:
        console = Console(width=300, record=True, file=open("/dev/null", "w"))
        for part in report.render(budget, site="h100-cluster", spec="gsm8k"):
            console.print(part)
        return console.export_text()

    unlimited = text(_budget(compiled, enable=True))
    assert f"{UNLIMITED_TOOL_TURNS} tool turns assumed: no turn limit is set" in unlimited
    assert "all turns together" in unlimited
    limited = text(_budget(compiled, enable=True, max_assistant_turns=2))
    assert "tool calls (2 per trajectory, the turn limit" in limited and "assumed" not in limited
    assert "tool calls" not in text(_budget(compiled))
