"""Per-row tool arguments (verl's ``extra_info.tools_kwargs``, issue 34): compile checks that every row names only
configured tools and known phases (one line naming the file and the row); the rollout loop reads a row's arguments
for one tool with ``row_tool_kwargs``."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hpcppo.agent.kwargs import PHASES, ToolKwargs, row_tool_kwargs, tools_kwargs_problems
from hpcppo.compiler import compile_config
from hpcppo.data.check import iter_extra_info_field
from hpcppo.data.dataset import write_prompts_parquet
from hpcppo.errors import ConfigError

from test_agent_config import _base

CALC = '\n[[rollout.multi_turn.tools]]\nclass_name = "hpcppo.agent.builtin.Calculator"\n'


def test_problems_of_one_row():
    tools = ["calculator"]
    assert tools_kwargs_problems(None, tools) == []
    assert tools_kwargs_problems({"calculator": {"create_kwargs": {"a": 1}, "execute_kwargs": None}}, tools) == []
    assert tools_kwargs_problems({"calculator": None, "search": None}, tools) == []  # Parquet's struct union
    [p] = tools_kwargs_problems({"search": {"create_kwargs": {}}}, tools)
    assert "tool 'search', which is not configured (configured: calculator)" in p
    [p] = tools_kwargs_problems({"calculator": {"create_kwarg": {}}}, tools)
    assert "unknown phase 'create_kwarg'; allowed: " + ", ".join(PHASES) in p
    [p] = tools_kwargs_problems({"calculator": {"create_kwargs": "x"}}, tools)
    assert "create_kwargs must be a mapping" in p
    assert "must be a mapping" in tools_kwargs_problems("{}", tools)[0]
    assert "must be a mapping of" in tools_kwargs_problems({"calculator": [1]}, tools)[0]


def test_a_rows_kwargs_for_one_tool():
    extra = {"index": 3, "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72", "x": None},
                                                                "release_kwargs": None}, "other": None}}
    assert row_tool_kwargs(extra, "calc_gsm8k_reward") == ToolKwargs(create={"ground_truth": "72"})
    assert row_tool_kwargs(extra, "calculator") == ToolKwargs()
    assert row_tool_kwargs(None, "calculator") == row_tool_kwargs({"tools_kwargs": None}, "calculator") == ToolKwargs()


def _data(tmp_path: Path, source: Path, bad: dict | None) -> Path:
    rows = pq.read_table(source).to_pylist()
    for i, row in enumerate(rows):
        kwargs = {"calculator": {"create_kwargs": {"seed": i}}} if i % 2 else None
        row["extra_info"] = {"index": i, "tools_kwargs": bad if (bad is not None and i == 7) else kwargs}
    out = tmp_path / "tools.parquet"
    write_prompts_parquet(rows, out)
    return out


def _spec(tmp_path: Path, tiny: dict, data: Path) -> Path:
    spec = tmp_path / "exp.toml"
    spec.write_text(_base({**tiny, "train": data}) + CALC)
    return spec


def test_rows_are_read_from_the_extra_info_column(tmp_path, random_tiny):
    data = _data(tmp_path, random_tiny["train"], None)
    found = list(iter_extra_info_field(data, "tools_kwargs"))
    assert [row for row, _ in found] == list(range(1, 256, 2))  # the null rows are left out
    assert found[0][1]["calculator"]["create_kwargs"] == {"seed": 1}
    assert list(iter_extra_info_field(random_tiny["train"], "tools_kwargs")) == []  # no such field
    compile_config(_spec(tmp_path, random_tiny, data), "local", check_memory=False)  # good rows compile


@pytest.mark.parametrize("bad, says", [
    ({"calculater": {"create_kwargs": {"seed": 1}}}, "names tool 'calculater', which is not configured"),
    ({"calculator": {"create": {"seed": 1}}}, "unknown phase 'create'"),
    ({"calculator": {"execute_kwargs": {"parameters": "x"}}},
     "extra_info.tools_kwargs.calculator.execute_kwargs gives 'parameters', which "
     "hpcppo.agent.builtin.Calculator.execute does not take as a keyword argument")])
def test_compile_names_the_file_and_the_row(tmp_path, random_tiny, bad, says):
    data = _data(tmp_path, random_tiny["train"], bad)
    with pytest.raises(ConfigError) as exc:
        compile_config(_spec(tmp_path, random_tiny, data), "local", check_memory=False)
    line = str(exc.value)
    assert "\n" not in line and str(data) in line and "row 7: " in line and says in line


def test_arguments_a_tools_method_does_not_take_are_named():
    """With the classes, each phase's argument names are checked against the method they go to: one without
    ``**kwargs`` takes its keyword parameters only; none may take the place of ``instance_id`` or ``parameters``."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from agent_tools_fixture import Counter, Recorder

    classes = {"counter": Counter, "kw": Recorder}
    row = {"counter": {"create_kwargs": {"start": 1}, "calc_reward_kwargs": {"bonus": 2}},
           "kw": {"execute_kwargs": {"anything": 1}, "release_kwargs": {"instance_id": "x"}}}
    problems = tools_kwargs_problems(row, classes, classes)
    assert problems == [
        "extra_info.tools_kwargs.counter.calc_reward_kwargs gives 'bonus', which "
        "agent_tools_fixture.Counter.calc_reward does not take as a keyword argument",
        "extra_info.tools_kwargs.kw.release_kwargs gives 'instance_id', which "
        "agent_tools_fixture.Recorder.release does not take as a keyword argument"]
    assert tools_kwargs_problems(row, classes) == []  # without the classes: the shape only
