"""``[rollout.multi_turn]``: multi-turn, tool-using rollouts, with verl's names
(``actor_rollout_ref.rollout.multi_turn.*`` in verl/trainer/config/rollout/rollout.yaml at b178a3c) and its tools
as ``[[rollout.multi_turn.tools]]`` tables or verl's ``tool_config_path`` YAML.

The rollout loop is ``hpcppo.rollout.tool_loop``; ``interaction_config_path`` (verl's simulated user turns) is
refused. Compile imports every tool class and checks its schema, without torch (``hpcppo.agent.check``, run by the
compiler).
"""

from __future__ import annotations

from typing import Any

import attrs

from hpcppo.config.fields import FieldValueError, opt

__all__ = ["MultiTurnSection", "ToolEntry", "TOOL_CALL_FORMATS"]

#: hpcppo.agent.parse.FORMATS (a test keeps the two in step; config imports no agent module).
TOOL_CALL_FORMATS = ("hermes", "compact")


@attrs.frozen(kw_only=True)
class ToolEntry:
    """``[[rollout.multi_turn.tools]]``: one tool, as an entry of verl's tool config YAML."""

    class_name: str = opt(help="Import path of the tool class, a subclass of hpcppo.agent.tool.Tool (built-in: "
                               "hpcppo.agent.builtin.Calculator, hpcppo.agent.builtin.PythonRunner).",
                          pattern=r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
    config: dict[str, Any] = opt(factory=dict, help="Keyword table given to the tool's constructor (verl's config).")
    tool_schema: dict[str, Any] = opt(factory=dict, help="The OpenAI function schema ({type = \"function\", function = "
                                                         "{name, description, parameters}}); {} = the class's own.")


@attrs.frozen(kw_only=True)
class MultiTurnSection:
    """``[rollout.multi_turn]``: the model calls tools during generation (verl's rollout.multi_turn)."""

    enable: bool = opt(False, help="Multi-turn, tool-using rollouts (verl's multi_turn.enable): the model calls the "
                                   "tools while it generates (docs/tools.md).")
    max_assistant_turns: int = opt(0, ge=0, help="Most assistant (model) turns per trajectory; 0 = no limit but the "
                                                 "response budget (verl's null).")
    max_user_turns: int = opt(0, ge=0, help="Most tool (observation) turns per trajectory; 0 = no limit but the "
                                            "response budget (verl's null).")
    max_tool_response_length: int = opt(256, ge=1, help="A tool's answer longer than this many tokens is cut, with a "
                                                        "\"...(truncated)...\" marker (verl's "
                                                        "max_tool_response_length, which counts characters).")
    tool_response_truncate_side: str = opt("middle", choices=("left", "middle", "right"),
                                           help="Which part of a long answer is kept, as verl: left = its start, "
                                                "right = its end, middle = both ends.")
    max_parallel_calls: int = opt(1, ge=1, help="Most tool calls run per assistant turn; further ones get an error "
                                                "observation (verl drops them silently).")
    format: str = opt("hermes", choices=TOOL_CALL_FORMATS,
                      help="Tool-call syntax: hermes = <tool_call>{json}</tool_call> (verl's); compact = "
                           "<call>name(key=value)</call> for tokenizers without braces or quotes (docs/tools.md).")
    tools: list[ToolEntry] = opt(factory=list, help="The tools ([[rollout.multi_turn.tools]] tables).")
    tool_config_path: str = opt("", path=True, help="verl's tool config YAML (tools: [{class_name, config, "
                                                    "tool_schema}]), added to tools; \"\" = none.")
    call_timeout_s: float = opt(60.0, gt=0.0, help="A tool call not answered in this many seconds costs its worker "
                                                   "(restarted) and gives an error observation.")
    max_tool_failures_per_step: int = opt(32, ge=0, help="A tool that fails (raises, crashes its worker, times "
                                                         "out) more often than this in one step, over all ranks, "
                                                         "stops the job with one line naming it (exit 1).")
    interaction_config_path: str = opt("", help="verl's simulated user turns: not supported yet; refused at compile.")

    def __attrs_post_init__(self) -> None:
        if self.enable and not self.tools and not self.tool_config_path:
            raise FieldValueError("enable", "multi-turn rollouts need tools: add [[rollout.multi_turn.tools]] "
                                            "tables or tool_config_path")
        if self.interaction_config_path:
            raise FieldValueError("interaction_config_path", "interaction turns (verl's user simulator) are not "
                                                             "supported yet; remove the key")
