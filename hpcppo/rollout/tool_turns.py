"""The tool-response turn as token ids, from the tokenizer's chat template, without re-tokenising the history.

After an assistant turn that called tools, the trajectory continues with the template's text between the end of
that assistant message and the next assistant turn's start: the end-of-assistant marker (unless the model already
emitted it), one ``tool`` message per call, the generation prompt. :class:`ToolTurns` finds that text by templating
a fixed two-message conversation whose assistant content is a sentinel, with and without the tool messages, and
taking what follows the sentinel: the delta. Only that new text is tokenised; the tokens sampled so far are never
decoded and tokenised again (token-in/token-out: what was sampled is what is trained on).

verl's ``ToolAgentLoop._handle_processing_tools_state`` (verl b178a3c, verl/experimental/agent_loop/
tool_agent_loop.py) templates the tool messages alone with the system prompt removed (``remove_system_prompt``);
the delta here is the same idea without assuming what a template puts before the first message.

A tool's answer longer than ``max_tool_response_length`` tokens is cut to that many (counted with this
tokenizer, where verl counts characters) around verl's markers: ``left`` keeps its start then
``...(truncated)``, ``right`` keeps its end after ``(truncated)...``, ``middle`` keeps both ends around
``...(truncated)...``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ToolTurns", "truncate_tool_text", "TRUNCATE_SIDES"]

TRUNCATE_SIDES = ("left", "middle", "right")
_SENTINEL = "\u2063hpcppo-sentinel\u2063"  # text no answer holds; only its position in the rendered template matters
_USER = "u"


def truncate_tool_text(tokenizer: Any, text: str, max_tokens: int, side: str) -> str:
    """``text`` cut to at most ``max_tokens`` tokens of its own (the marker added), as verl's
    ``ToolAgentLoop._call_tool`` cuts (verl b178a3c) but counting tokens."""
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"tool_response_truncate_side must be one of {', '.join(TRUNCATE_SIDES)}, not {side!r}")
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text

    def dec(part: Sequence[int]) -> str:
        return str(tokenizer.decode(list(part), skip_special_tokens=False))

    if side == "left":
        return dec(ids[:max_tokens]) + "...(truncated)"
    if side == "right":
        return "(truncated)..." + dec(ids[-max_tokens:])
    half = max_tokens // 2
    return dec(ids[:half]) + "...(truncated)..." + dec(ids[len(ids) - half:] if half else [])


class ToolTurns:
    """Builds the token ids of a tool turn for one tokenizer (its chat template must render ``tool`` messages).

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        max_tool_response_length: the most tokens of one tool answer (then cut, see the module docstring).
        truncate_side: ``left``, ``middle`` or ``right``.
    """

    def __init__(self, tokenizer: Any, *, max_tool_response_length: int, truncate_side: str = "middle"):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tool loop needs a tokenizer with a chat template (it renders the tool turns)")
        if truncate_side not in TRUNCATE_SIDES:
            raise ValueError(f"tool_response_truncate_side must be one of {', '.join(TRUNCATE_SIDES)}, "
                             f"not {truncate_side!r}")
        self.tokenizer = tokenizer
        self.max_tool_response_length = max_tool_response_length
        self.truncate_side = truncate_side
        base = self._render([], add_generation_prompt=False)
        # What the template writes after an assistant message's content when nothing follows: its end marker.
        self.assistant_end_ids: list[int] = self._encode(base)

    def _render(self, tool_texts: Sequence[str], *, add_generation_prompt: bool) -> str:
        messages = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _SENTINEL}]
        messages += [{"role": "tool", "content": t} for t in tool_texts]
        text = str(self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt))
        at = text.find(_SENTINEL)
        if at < 0:
            raise ValueError("the chat template does not write the assistant's content as given; the tool loop "
                             "cannot find where a tool turn starts")
        return text[at + len(_SENTINEL):]

    def _encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def truncated(self, text: str) -> str:
        return truncate_tool_text(self.tokenizer, text, self.max_tool_response_length, self.truncate_side)

    def ids(self, tool_texts: Sequence[str], *, after: int | None = None) -> list[int]:
        """The tool turn's token ids for these answers (each truncated), up to the next assistant turn's start.

        ``after``: the last token the model sampled. When it is the first token of the template's end-of-assistant
        marker (the model ended its turn with EOS after its calls), that token is not written a second time.
        """
        ids = self._encode(self._render([self.truncated(t) for t in tool_texts], add_generation_prompt=True))
        end = self.assistant_end_ids
        if after is not None and end and ids[:1] == [after] and end[0] == after:
            ids = ids[1:]
        return ids
