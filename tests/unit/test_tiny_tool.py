"""The tiny model's tool variant: tokenizer, call trajectories, settings, a small build and the CLI's refusals
(the full build's warm-start band is checked by tests/e2e/test_tool_run.py, which builds it anyway)."""

from __future__ import annotations

import json

import pytest

from hpcppo import tiny
from hpcppo.agent.builtin import Calculator
from hpcppo.agent.parse import COMPACT_END, COMPACT_START, parse_calls
from hpcppo.data import arith_tool
from hpcppo.errors import ConfigError, PathError
from hpcppo.tiny import tool_warmstart
from hpcppo.tiny.settings import CALCULATOR_NAME, TOOL_DEFAULTS
from hpcppo.tiny.tokenizer import TOOL_TOKENS

SMALL = {"steps": 2, "warmup_steps": 1, "eval_every": 1, "eval_size": 8, "batch_size": 16}


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tokenizer("tool")


def test_the_tool_tokens_fill_padding_slots_and_every_other_id_is_the_base_tokenizers(tok) -> None:
    base = tiny.build_tokenizer()
    assert len(tok) == len(base) == tiny.VOCAB_SIZE
    ids = [tok.convert_tokens_to_ids(t) for t in TOOL_TOKENS]
    assert all(base.convert_ids_to_tokens(i).startswith("<extra_") for i in ids)
    first = min(ids)
    assert ids == [first, first + 1, first + 2]
    assert [tok.convert_ids_to_tokens(i) for i in range(first)] == [base.convert_ids_to_tokens(i) for i in range(first)]
    assert all(tok.convert_ids_to_tokens(i).startswith("<extra_") for i in range(first + 3, 64))
    assert (COMPACT_START, COMPACT_END) == TOOL_TOKENS[1:]
    assert CALCULATOR_NAME == (Calculator.default_schema or {})["function"]["name"]


def test_markers_are_one_token_each_and_survive_decoding(tok) -> None:
    text = "<|user|>123*456=<|assistant|><call>calculator(123*456)</call><|tool|>56088<|assistant|>56088"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) - sum(len(m) - 1 for m in ("<|user|>", "<|assistant|>", "<call>", "</call>",
                                                               "<|tool|>", "<|assistant|>"))
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text
    assert arith_tool.compute_score("hpcppo/arith-tool", tok.decode(ids, skip_special_tokens=True), "56088") == 1.0


def test_a_call_trajectory_renders_as_the_chat_template_and_trains_on_the_assistant_turns_only(tok) -> None:
    row = arith_tool.generate_rows(1, seed=0)[0]
    a, b = row["extra_info"]["operands"]
    call = tool_warmstart.call_text(row)
    assert call == f"<call>calculator({a}*{b})</call>"
    parsed = parse_calls(call, {CALCULATOR_NAME: Calculator.default_schema}, "compact", 1)
    assert parsed.calls[0].arguments == {"expression": f"{a}*{b}"}
    assert Calculator({}, None).execute("i", parsed.calls[0].arguments)[0] == str(a * b)

    batch = tool_warmstart.tool_supervised_batch(tok, [row])
    ids = batch["input_ids"][0].tolist()
    product = str(a * b)
    rendered = tok.apply_chat_template(row["prompt"] + [{"role": "assistant", "content": call},
                                                        {"role": "tool", "content": product},
                                                        {"role": "assistant", "content": product}], tokenize=False)
    assert tok.decode(ids) == rendered
    labelled = [t for t, lab in zip(ids, batch["labels"][0].tolist()) if lab != -100]
    assert tok.decode(labelled) == call + "<eos>" + product + "<eos>"
    assert tool_warmstart.tool_turn_text(tok, product) == f"<|tool|>{product}<|assistant|>"


def test_settings_of_the_tool_variant() -> None:
    s = tiny.TinySettings.of(variant="tool")
    assert (s.min_operand, s.max_operand, s.max_position_embeddings) == (100, 999, 256)
    assert s.data_source == "hpcppo/arith-tool" and s.distinct_problems() == 900**2
    assert s.digest() != tiny.TinySettings.of().digest()
    assert tiny.TinySettings.of(variant="tool", max_operand=500).max_operand == 500
    assert set(TOOL_DEFAULTS) <= {f for f in tiny.TinySettings.__dataclass_fields__}


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"variant": "chat"}, r"--variant: unknown variant 'chat'; allowed: arith, tool"),
    ({"min_operand": 3}, r"min_operand: applies to the tool variant only"),
    ({"variant": "tool", "max_new_tokens": 21}, r"max_new_tokens: 21 new tokens cannot hold the call .* allowed: >= 22"),
    ({"variant": "tool", "min_operand": 999}, r"tiny-model task: operands must satisfy 0 <= min_operand < max_operand"),
])
def test_bad_tool_settings_are_refused(tmp_path, kwargs, match) -> None:
    with pytest.raises(ConfigError, match=match):
        tiny.build_tiny_model_and_data(tmp_path / "m", seed=0, **kwargs)
    assert not (tmp_path / "m").exists()


def test_a_small_build_writes_the_tool_model_and_its_data_and_keeps_the_other_variants_build(tmp_path) -> None:
    info = tiny.build_tiny_model_and_data(tmp_path / "m", tmp_path / "d", seed=0, variant="tool", train_size=8,
                                          val_size=4, **SMALL)
    assert info["built"] and info["task"]["data_source"] == "hpcppo/arith-tool"
    assert set(info["warm_start"]) >= {"greedy_accuracy", "sampled_accuracy", "train_sampled_accuracy_without_tool",
                                       "task_stage"}
    assert info["warm_start"]["train_sampled_accuracy_without_tool"] == 0.0  # a call alone is no answer
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["max_position_embeddings"] == 256 and saved["vocab_size"] == 64
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tmp_path / "m").convert_tokens_to_ids("<call>") == 58
    again = tiny.build_tiny_model_and_data(tmp_path / "m", tmp_path / "d", seed=0, variant="tool", train_size=8,
                                           val_size=4, **SMALL)
    assert again["built"] is False
    with pytest.raises(PathError, match=r"m holds the tool variant's build, not the arith variant's; choose another "
                                        r"--out, or --force to replace it"):
        tiny.build_tiny_model_and_data(tmp_path / "m", seed=0, **SMALL)
    assert tiny.read_info(tmp_path / "m")["settings"]["variant"] == "tool"


def test_cli_refuses_a_reward_model_for_the_tool_variant(tmp_path, capsys) -> None:
    from hpcppo.cli import main

    argv = ["tools", "make-model", "--variant", "tool", "--out", str(tmp_path / "m"), "--data-out", str(tmp_path / "d"),
            "--reward-out", str(tmp_path / "r")]
    assert main(argv) == 2
    assert capsys.readouterr().err == ("hpcppo: error: --reward-out: the tiny reward model scores the arith task only; "
                                       "leave it out with --variant tool\n")
    assert not list(tmp_path.iterdir())


def test_cli_checks_every_output_path_before_building_the_tool_model(tmp_path, capsys) -> None:
    from hpcppo.cli import main

    same = tmp_path / "both"
    argv = ["tools", "make-model", "--variant", "tool", "--out", str(same), "--data-out", str(same)]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err and "--data-out" in err, err
    assert not list(tmp_path.iterdir())
