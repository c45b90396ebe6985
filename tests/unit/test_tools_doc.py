"""docs/tools.md's example tool is real: the marked block, imported as a module, passes compile's check of the
tools (hpcppo.agent.check, a class_name import path and its schema) and plays as the page says."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from hpcppo.agent.check import tool_names, tool_problems
from hpcppo.agent.kwargs import row_tool_kwargs
from hpcppo.agent.tool import ToolSpec, build_tool

DOC = Path(__file__).resolve().parents[2] / "docs" / "tools.md"


def example() -> str:
    m = re.search(r"<!-- doc-test: example-tool -->\n```python\n(.*?)```", DOC.read_text(), re.S)
    assert m, "docs/tools.md lost its marked example tool"
    return m.group(1)


def test_the_example_is_about_twenty_lines():
    assert len(example().strip().splitlines()) <= 25


def test_the_doc_example_passes_compiles_check_and_plays(tmp_path, monkeypatch):
    (tmp_path / "doc_tools.py").write_text(example())
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        spec = ToolSpec("doc_tools.GuessNumber")
        assert tool_problems([spec]) == [] and tool_names([spec]) == ["guess"]
        tool = build_tool(spec)
        # the secret as a row gives it (extra_info.tools_kwargs), through the loop's lookup
        row = {"tools_kwargs": {"guess": {"create_kwargs": {"secret": 17}}}}
        iid = tool.create(**row_tool_kwargs(row, "guess").create)
        assert tool.execute(iid, {"n": 10})[:2] == ("higher", -0.1)
        assert tool.execute(iid, {"n": 20})[0] == "lower" and tool.calc_reward(iid) == 0.0
        assert tool.execute(iid, {"n": 17}) == ("correct", 1.0, {"guess/solved": 1.0})
        assert tool.calc_reward(iid) == 1.0
        tool.release(iid)
    finally:
        sys.modules.pop("doc_tools", None)
