"""The tiny model's tokenizer: round trips (direct and through AutoTokenizer) and the chat template."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcppo.data import synthetic
from hpcppo import tiny
from hpcppo.models import position_ids_from_mask
from hpcppo.tiny import make as tiny_make


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tokenizer()


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory):
    """Tokenizer and a (tiny, untrained) model saved side by side, as a build does."""
    d = tmp_path_factory.mktemp("tok")
    t = tiny.build_tokenizer()
    model = tiny.build_model(t, tiny.TinySettings(hidden_size=16, intermediate_size=32, num_heads=2, num_kv_heads=1, num_layers=1))
    model.save_pretrained(d)
    t.save_pretrained(d)
    tiny_make._pin_tokenizer_class(d)
    return d


def test_vocab_is_padded_to_the_models_size_with_special_ids(tok) -> None:
    assert len(tok) == tiny.VOCAB_SIZE == 64
    assert (tok.pad_token_id, tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2, 3)
    assert tok.padding_side == "left"
    # every id decodes to something: a model emitting an unused id still yields text
    assert all(tok.decode([i]) for i in range(len(tok)))


@pytest.mark.parametrize("text", ["37+58=", "95", "-3", "hello world", "12+7=19 a b", "what is 3 * (4 - 1)?\nok.", ""])
def test_encode_decode_round_trip(tok, text: str) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text


def test_characters_outside_the_alphabet_become_unk(tok) -> None:
    ids = tok.encode("A1", add_special_tokens=False)
    assert ids == [tok.unk_token_id, tok.convert_tokens_to_ids("1")]


def test_no_bos_is_added_outside_the_template(tok) -> None:
    # bos comes from the chat template only; tokenizing templated text again must not double it
    assert tok("12+7=")["input_ids"] == tok("12+7=", add_special_tokens=False)["input_ids"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=tiny.CHARS, max_size=40))
def test_round_trip_over_the_whole_alphabet(tok, text: str) -> None:
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_chat_template_output(tok) -> None:
    msgs = [{"role": "user", "content": "12+7="}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<bos><|user|>12+7=<|assistant|>"
    assert text.endswith("<|assistant|>")
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.convert_tokens_to_ids("<|assistant|>")
    assert ids.count(tok.bos_token_id) == 1
    # without the generation prompt the text stops after the user turn
    assert tok.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False) == "<bos><|user|>12+7="
    # an assistant turn ends with eos, the token the policy emits to stop
    full = tok.apply_chat_template(msgs + [{"role": "assistant", "content": "19"}], tokenize=False)
    assert full == "<bos><|user|>12+7=<|assistant|>19<eos>"


def test_prompt_helpers_left_pad_a_batch(tok) -> None:
    rows = synthetic.generate_rows(2, seed=0, split="train", max_operand=999)
    rows[0]["prompt"][0]["content"] = "1+2="  # force different lengths
    enc = tiny.encode_prompts(tok, rows)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    assert ids.shape == mask.shape and ids.shape[0] == 2
    short = int(mask[0].sum())
    assert short < ids.shape[1]
    assert (ids[0, : ids.shape[1] - short] == tok.pad_token_id).all()  # padding on the left
    assert tok.decode(ids[0, -short:]) == "<bos><|user|>1+2=<|assistant|>"
    pos = position_ids_from_mask(mask)
    assert pos[0, -short:].tolist() == list(range(short))
    assert pos[1].tolist() == list(range(ids.shape[1]))


def test_supervised_batch_labels_only_the_answer(tok) -> None:
    rows = synthetic.generate_rows(3, seed=1, split="train")
    batch = tiny.supervised_batch(tok, rows)
    for i, row in enumerate(rows):
        labels = [x for x in batch["labels"][i].tolist() if x != -100]
        assert tok.decode(labels[:-1]) == row["reward_model"]["ground_truth"]
        assert labels[-1] == tok.eos_token_id
        n = int(batch["attention_mask"][i].sum())
        assert batch["attention_mask"][i, :n].all()  # right padding
        assert tok.decode(batch["input_ids"][i, :n]).startswith("<bos><|user|>" + row["prompt"][0]["content"])


def test_saved_tokenizer_round_trips_through_autotokenizer(saved_dir, tok) -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    assert json.loads((saved_dir / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    auto = AutoTokenizer.from_pretrained(saved_dir)
    fast = PreTrainedTokenizerFast.from_pretrained(saved_dir)
    texts = ["hello world 12+7=19 a b", "37+58=", " 95 ", "a\nb"]
    for loaded in (auto, fast):
        assert len(loaded) == len(tok)
        assert loaded.padding_side == "left"
        for text in texts:
            assert loaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
            assert loaded.decode(loaded.encode(text, add_special_tokens=False)) == text
        msgs = [{"role": "user", "content": "3+4="}]
        assert loaded.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == "<bos><|user|>3+4=<|assistant|>"
        assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 2, 3)
