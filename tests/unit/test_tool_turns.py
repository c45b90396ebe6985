"""The tool turn's token ids from the chat template's delta (hpcppo.agent.tool_turns), on real tokenizers: the
ChatML one renders tools as Qwen2.5 does (a user turn of <tool_response> blocks), the tiny one as a <|tool|> turn."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hpcppo.agent.tool_turns import ToolTurns, truncate_tool_text

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


@pytest.mark.parametrize("template, match", [
    # a template of user and assistant turns only: a tool message's content is dropped
    ("{% for m in messages %}{% if m['role'] in ['user', 'assistant'] %}{{ '<|im_start|>' + m['role'] + '\\n' + "
     "m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}", "has no 'tool' role: it drops"),
    # one that refuses other roles, as many do with raise_exception
    ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}{{ raise_exception('Only user and "
     "assistant roles are supported!') }}{% endif %}{{ m['content'] }}{% endfor %}",
     r"cannot render a 'tool' message \(TemplateError: Only user and assistant roles are supported!\)"),
])
def test_a_template_without_a_tool_role_is_refused(template, match):
    tok = hermes_tokenizer()
    tok.chat_template = template
    with pytest.raises(ValueError, match=match) as err:
        ToolTurns(tok, max_tool_response_length=8)
    assert "\n" not in str(err.value)


def test_a_tool_turn_the_tokenizer_cannot_write_is_refused():
    from hpcppo import tiny  # the arith tokenizer: its template writes <|tool|>, which it has no token for

    with pytest.raises(ValueError, match=r"the tool turn the chat template writes \('<eos><\|tool\|><\|assistant\|>'\) "
                                         r"has text the tokenizer cannot write"):
        ToolTurns(tiny.build_tokenizer(), max_tool_response_length=8)
    ToolTurns(tiny.build_tokenizer("tool"), max_tool_response_length=8)


def test_format_markers():
    from hpcppo import tiny
    from hpcppo.agent.tool_turns import closing_marker_notes, format_problems

    assert format_problems(compact_tokenizer(), "compact") == [] == format_problems(hermes_tokenizer(), "hermes")
    assert format_problems(hermes_tokenizer(), "compact") == [
        "the compact call format needs <call> and </call> as one token each, and the tokenizer has no such token"]
    assert format_problems(tiny.build_tokenizer(), "hermes") == [
        "the hermes call format writes <tool_call> and </tool_call>, which the tokenizer cannot write (its unknown "
        "token '<unk>' comes out)"]
    assert closing_marker_notes(hermes_tokenizer(), "hermes", 1) == []
    assert closing_marker_notes(compact_tokenizer(), "hermes", 2) == []
    # </tool_call> written in characters: only the end of the turn ends it
    [note] = closing_marker_notes(compact_tokenizer(), "hermes", 1)
    assert note.startswith("max_parallel_calls = 1 but </tool_call> is not one token")
