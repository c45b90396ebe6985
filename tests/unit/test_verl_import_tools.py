"""``import-verl`` of a multi-turn, tool-using verl run (issue 34, point 8): verl's multi_turn.* keys and its tool
config YAML translated (the gsm8k tool -> hpcppo.agent.builtin.Gsm8kAnswer), unknown tool classes named in one line,
interaction turns refused in one line; and Gsm8kAnswer itself, checked against verl's gsm8k tool's behaviour."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hpcppo.agent.builtin import Gsm8kAnswer, gsm8k_flexible_score
from hpcppo.agent.check import tool_problems
from hpcppo.agent.tool import ToolSpec, build_tool
from hpcppo.errors import ConfigError
from hpcppo.verl import names as verl
from hpcppo.verl.importer import import_verl

MT = "actor_rollout_ref.rollout.multi_turn."
VERL = "python3 -m verl.trainer.main_ppo data.train_files=d.parquet actor_rollout_ref.model.path=/m \\\n"
# verl's examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml (b178a3c), plus a tool hpcppo lacks
TOOL_YAML = """tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k."
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The model's answer to the GSM8K math problem, must be a digits"
          required: ["answer"]
  - class_name: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
    config: {type: native, sandbox_fusion_url: "http://localhost:8080"}
"""


def _import(tmp_path: Path, settings: str) -> tuple[dict, list, str | None]:
    (tmp_path / "tools.yaml").write_text(TOOL_YAML)
    (tmp_path / "run.sh").write_text(VERL + settings + "\n")
    out = tmp_path / "exp.toml"
    imp, problem = import_verl(str(tmp_path / "run.sh"), out, cwd=tmp_path)
    return tomllib.loads(out.read_text()), imp.report, problem


def test_multi_turn_keys_and_the_tool_config_are_translated(tmp_path):
    data, report, problem = _import(tmp_path, " ".join([
        f"{MT}enable=True", f"{MT}max_assistant_turns=5", f"{MT}max_user_turns=null", f"{MT}format=hermes",
        f"{MT}max_parallel_calls=2", f"{MT}max_tool_response_length=512", f"{MT}tool_response_truncate_side=left",
        f"{MT}tool_config_path=tools.yaml"]))
    assert problem is None  # the written spec loads
    mt = data["rollout"]["multi_turn"]
    assert (mt["enable"], mt["max_assistant_turns"], mt["max_user_turns"], mt["format"], mt["max_parallel_calls"],
            mt["max_tool_response_length"], mt["tool_response_truncate_side"]) == (True, 5, 0, "hermes", 2, 512, "left")
    [tool] = mt["tools"]
    assert tool["class_name"] == "hpcppo.agent.builtin.Gsm8kAnswer" and tool["config"] == {}
    assert tool["tool_schema"]["function"]["name"] == "calc_gsm8k_reward"
    assert tool_problems([ToolSpec(tool["class_name"], tool["config"], tool["tool_schema"])]) == []
    # the tool verl has and hpcppo lacks: one line naming it
    [line] = [why for kind, text, why in report if "tool_config_path" in text]
    assert "verl.tools.sandbox_fusion_tools.SandboxFusionTool" in line and "\n" not in line


def test_a_format_hpcppo_lacks_is_reported_and_typos_get_a_did_you_mean(tmp_path):
    data, report, _ = _import(tmp_path, f"{MT}enable=True {MT}format=gpt-oss {MT}max_parallel_cals=2")
    reasons = {text: why for _, text, why in report}
    assert "hermes" in reasons[f"{MT}format=gpt-oss"]
    assert f"did you mean {MT}max_parallel_calls?" in reasons[f"{MT}max_parallel_cals=2"]
    assert "format" not in data.get("rollout", {}).get("multi_turn", {})


def test_interaction_turns_are_refused_in_one_line_and_nothing_is_written(tmp_path):
    with pytest.raises(ConfigError) as exc:
        _import(tmp_path, f"{MT}enable=True {MT}interaction_config_path=interaction.yaml")
    assert "interaction turns" in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "exp.toml").exists()


def test_verl_names_point_to_the_multi_turn_section():
    assert verl.translate_override(f"{MT}max_assistant_turns", "null")[:2] == ("rollout.multi_turn.max_assistant_turns", 0)
    assert "rollout.multi_turn.enable" in verl.hint(f"{MT}enable")
    assert "rollout.multi_turn.max_user_turns" in verl.hint("multi_turn.max_user_turns")


def _tool() -> Gsm8kAnswer:
    tool = build_tool(ToolSpec("hpcppo.agent.builtin.Gsm8kAnswer"))
    assert isinstance(tool, Gsm8kAnswer) and tool.name == "calc_gsm8k_reward"
    return tool


def test_gsm8k_answer_rewards_as_verls_gsm8k_tool():
    tool = _tool()
    # as verl's agent loop passes a row's extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs
    iid = tool.create(create_kwargs={"ground_truth": "72"})
    assert tool.execute(iid, {"answer": "71"}) == ("Current parsed answer='71' reward=0.0", -0.05, {"gsm8k/correct": 0.0})
    text, step, _ = tool.execute(iid, {"answer": "72"})
    assert (text, step, tool.calc_reward(iid)) == ("Current parsed answer='72' reward=1.0", 0.0, 1.0)
    assert tool.execute(iid, {"answer": "#### 72"})[1] == -0.05  # no improvement: verl's penalty
    other = tool.create(ground_truth="5")
    assert tool.calc_reward(other) == 0.0
    tool.release(iid)
    assert iid not in tool._instances


@pytest.mark.parametrize("solution, truth, score", [
    ("#### 72", "72", 1.0), ("so 3 apples, then 72", "72", 1.0), ("#### 1,000", "1000", 0.0),  # verl keeps commas
    ("no number", "1", 0.0), ("#### -4", "-4", 1.0), ("x" * 400 + " 7", "7", 1.0), ("7 " + "x" * 400, "7", 0.0)])
def test_flexible_score_as_verls(solution, truth, score):
    assert gsm8k_flexible_score(solution, truth) == score


def test_without_enable_the_other_multi_turn_keys_are_reported_not_written(tmp_path):
    # a composed verl YAML lists every multi_turn key with enable false: none of them acts in verl then
    data, report, problem = _import(tmp_path, f"{MT}enable=False {MT}max_assistant_turns=5 {MT}tool_config_path=tools.yaml")
    assert problem is None and data["rollout"]["multi_turn"] == {"enable": False}
    reasons = {text: why for _, text, why in report}
    assert "only with multi_turn.enable=true" in reasons[f"{MT}max_assistant_turns=5"]
    assert "only with multi_turn.enable=true" in reasons[f"{MT}tool_config_path=tools.yaml"]
