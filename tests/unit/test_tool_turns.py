"""The tool turn's token ids from the chat template's delta (hpcppo.rollout.tool_turns), on real tokenizers: the
ChatML one renders tools as Qwen2.5 does (a user turn of <tool_response> blocks), the tiny one as a <|tool|> turn."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpcppo.rollout.tool_turns import ToolTurns, truncate_tool_text

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tool_loop_fixture import compact_tokenizer, hermes_tokenizer  # noqa: E402


def tokens(tok, ids):
    return tok.convert_ids_to_tokens(ids)


def test_chatml_tool_turn_is_the_templates_text_after_the_assistant_message():
    tok = hermes_tokenizer()
    turns = ToolTurns(tok, max_tool_response_length=64)
    assert tokens(tok, turns.assistant_end_ids) == ["<|im_end|>", "\n"]
    ids = turns.ids(["42", "7"])
    want = ("<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\n7\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert ids == tok.encode(want, add_special_tokens=False)
    # the same turn, rendered in a whole conversation: the delta is exactly what the template adds there
    history = [{"role": "user", "content": "what is 6*7"}, {"role": "assistant", "content": "<tool_call>x</tool_call>"}]
    whole = tok.apply_chat_template(history + [{"role": "tool", "content": "42"}], tokenize=False,
                                    add_generation_prompt=True)
    before = tok.apply_chat_template(history, tokenize=False)
    cut = before[:-len("<|im_end|>\n")]
    assert tok.encode(whole[len(cut):], add_special_tokens=False) == turns.ids(["42"])


def test_an_eos_the_model_sampled_is_not_written_twice():
    tok = hermes_tokenizer()
    turns = ToolTurns(tok, max_tool_response_length=64)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    full, after_eos = turns.ids(["1"]), turns.ids(["1"], after=im_end)
    assert full[0] == im_end and after_eos == full[1:]
    assert turns.ids(["1"], after=tok.convert_tokens_to_ids("</tool_call>")) == full


def test_tiny_template_tool_turn():
    tok = compact_tokenizer()
    turns = ToolTurns(tok, max_tool_response_length=64)
    assert tokens(tok, turns.ids(["12"])) == ["<eos>", "<|tool|>", "1", "2", "<|assistant|>"]
    assert tokens(tok, turns.ids(["12"], after=tok.eos_token_id)) == ["<|tool|>", "1", "2", "<|assistant|>"]


@pytest.mark.parametrize("side, want", [
    ("left", "0123...(truncated)"),
    ("right", "(truncated)...6789"),
    ("middle", "01...(truncated)...89"),
])
def test_long_answers_are_cut_in_tokens_with_verls_markers(side, want):
    tok = hermes_tokenizer()
    assert truncate_tool_text(tok, "0123456789", 4, side) == want
    assert truncate_tool_text(tok, "0123", 4, side) == "0123"  # at the limit: unchanged
    turns = ToolTurns(tok, max_tool_response_length=4, truncate_side=side)
    assert want in tok.decode(turns.ids(["0123456789"]), skip_special_tokens=False)


def test_a_tokenizer_without_a_usable_template_is_refused():
    tok = hermes_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        ToolTurns(tok, max_tool_response_length=8)
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}{% endfor %}"  # drops the content
    with pytest.raises(ValueError, match="does not write the assistant's content"):
        ToolTurns(tok, max_tool_response_length=8)
    with pytest.raises(ValueError, match="left, middle, right"):
        ToolTurns(hermes_tokenizer(), max_tool_response_length=8, truncate_side="top")
