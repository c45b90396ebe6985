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

The same checks run in the job (:class:`ToolTurns`, :func:`format_problems`, when the tool loop is built) and in
``hpcppo compile`` on the login node (the tokenizer loaded by :mod:`hpcppo.agent.tokenizer`, without torch): a chat
template that cannot render a ``tool`` message (it raises, or drops its content), a tool turn whose text the
tokenizer cannot write (unknown tokens), or a call format whose markers the tokenizer lacks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hpcppo.agent.parse import COMPACT_END, COMPACT_START, HERMES_END, HERMES_START

__all__ = ["ToolTurns", "truncate_tool_text", "TRUNCATE_SIDES", "MARKERS", "marker_id", "format_problems",
           "closing_marker_notes"]

TRUNCATE_SIDES = ("left", "middle", "right")
_SENTINEL = "\u2063hpcppo-sentinel\u2063"  # text no answer holds; only its position in the rendered template matters
_TOOL_SENTINEL = "\u2063hpcppo-tool-answer\u2063"  # the same, for a tool message's content
_USER = "u"
#: Each call format's opening and closing markers (hpcppo.agent.parse).
MARKERS = {"hermes": (HERMES_START, HERMES_END), "compact": (COMPACT_START, COMPACT_END)}


def marker_id(tokenizer: Any, marker: str) -> int | None:
    """The id of ``marker`` when the tokenizer has it as one token (not its unknown token), else None."""
    found = tokenizer.convert_tokens_to_ids(marker)
    if not isinstance(found, int) or found == tokenizer.unk_token_id:
        return None
    return found


def _unknown(tokenizer: Any, text: str) -> bool:
    unk = tokenizer.unk_token_id
    return unk is not None and unk in tokenizer.encode(text, add_special_tokens=False)


def format_problems(tokenizer: Any, fmt: str) -> list[str]:
    """What the tokenizer lacks for the call format ``fmt``: ``compact`` needs ``<call>`` and ``</call>`` as one token
    each (docs/tools.md); ``hermes`` needs its markers to be writable (no unknown token in them)."""
    if fmt == "compact":
        missing = [m for m in MARKERS[fmt] if marker_id(tokenizer, m) is None]
        if missing:
            return [f"the {fmt} call format needs {' and '.join(missing)} as one token each, and the tokenizer "
                    f"has no such token"]
        return []
    unwritable = [m for m in MARKERS[fmt] if _unknown(tokenizer, m)]
    if unwritable:
        return [f"the {fmt} call format writes {' and '.join(unwritable)}, which the tokenizer cannot write (its "
                f"unknown token {tokenizer.unk_token!r} comes out)"]
    return []


def closing_marker_notes(tokenizer: Any, fmt: str, max_parallel_calls: int) -> list[str]:
    """A line when ``max_parallel_calls`` = 1 but the format's closing marker is not one token: the loop cannot stop
    a turn there (:func:`hpcppo.rollout.tool_loop.closing_stop_ids`), so each turn runs to EOS (verl's way)."""
    closer = MARKERS[fmt][1]
    if max_parallel_calls != 1 or marker_id(tokenizer, closer) is not None:
        return []
    return [f"max_parallel_calls = 1 but {closer} is not one token of the tokenizer: a turn cannot stop at the end "
            f"of its call and runs to EOS; only its first call runs"]


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
        self._check_tool_message()

    def _check_tool_message(self) -> None:
        """ValueError (one line) unless the template writes a ``tool`` message's content and the tokenizer can write
        the text around it."""
        try:
            turn = self._render([_TOOL_SENTINEL], add_generation_prompt=True)
        except ValueError:
            raise
        except Exception as exc:  # noqa: BLE001 - a template's raise_exception, a jinja error: one line
            first = (str(exc).strip().splitlines() or [""])[0]
            raise ValueError(f"the chat template cannot render a 'tool' message ({type(exc).__name__}: {first}); "
                             f"the tool loop writes each tool answer as one") from None
        if _TOOL_SENTINEL not in turn:
            raise ValueError("the chat template has no 'tool' role: it drops a tool message's content, so the model "
                             "would never see its tools' answers")
        around = turn.replace(_TOOL_SENTINEL, "")
        if _unknown(self.tokenizer, around):
            raise ValueError(f"the tool turn the chat template writes ({around!r}) has text the tokenizer cannot "
                             f"write (it becomes its unknown token {self.tokenizer.unk_token!r})")

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
