"""Compile (with the paths check) refuses a multi-turn run whose tokenizer cannot write the tool turns or the calls,
in one line naming the spec, the key and what is missing, with the checks the job runs when it builds the tool loop
(hpcppo.agent.tool_turns); the tokenizer is loaded without torch (tests/unit/test_cli_imports.py checks that)."""

from __future__ import annotations

import shutil
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from hpcppo import tiny
from hpcppo.agent.tokenizer import TokenizerNotLoaded, load_tokenizer
from hpcppo.compiler import compile_config
from hpcppo.errors import ConfigError, SettingWarning

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tool_loop_fixture import HERMES_CHARS, _char_tokenizer, hermes_tokenizer  # noqa: E402

NO_TOOL_ROLE = ("{% for m in messages %}{% if m['role'] in ['user', 'assistant'] %}{{ '<|im_start|>' + m['role'] + "
                "'\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _model(tmp_path: Path, random_tiny: dict[str, Path], tokenizer) -> Path:
    """The random tiny model's config and weights with ``tokenizer`` saved beside them."""
    model = tmp_path / "model"
    model.mkdir(parents=True)
    for f in random_tiny["model"].iterdir():
        if f.name in ("config.json", "generation_config.json") or f.suffix == ".safetensors":
            shutil.copy(f, model / f.name)
    tokenizer.save_pretrained(model)
    return model


def _spec(tmp_path: Path, random_tiny: dict[str, Path], model: Path, multi_turn: str = "") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "exp.toml"
    spec.write_text(textwrap.dedent(f"""\
        name = "tools"
        [model]
        path = "{model}"
        dtype = "float32"
        [data]
        train_files = ["{random_tiny['train']}"]
        max_prompt_length = 48
        max_response_length = 8
        [trainer]
        train_batch_size = 8
        total_steps = 2
        [actor]
        ppo_mini_batch_size = 8
        ppo_micro_batch_size_per_gpu = 4
        [critic]
        ppo_micro_batch_size_per_gpu = 4
        [rollout.multi_turn]
        enable = true
        """) + textwrap.dedent(multi_turn) + '[[rollout.multi_turn.tools]]\nclass_name = '
                                             '"hpcppo.agent.builtin.Calculator"\n')
    return spec


def _compile(spec: Path):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compiled = compile_config(spec, "local", check_memory=False)
    return compiled, [str(w.message) for w in seen if issubclass(w.category, SettingWarning)]


def _refusal(spec: Path) -> str:
    with pytest.raises(ConfigError) as err:
        compile_config(spec, "local", check_memory=False)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{spec}: "), message
    return message


def test_compact_needs_the_tiny_tool_variants_markers(tmp_path, random_tiny):
    tool = _model(tmp_path / "tool", random_tiny, tiny.build_tokenizer("tool"))
    compiled, notes = _compile(_spec(tmp_path / "tool", random_tiny, tool, 'format = "compact"\n'))
    assert compiled.experiment.rollout.multi_turn.enable and not [n for n in notes if "multi_turn" in n]
    spec = _spec(tmp_path, random_tiny, random_tiny["model"], 'format = "compact"\n')  # the arith tokenizer
    assert _refusal(spec) == (f"{spec}: rollout.multi_turn.format: the compact call format needs <call> and </call> "
                              f"as one token each, and the tokenizer has no such token ({random_tiny['model']}); "
                              f"allowed: a tokenizer that has them (`hpcppo tools make-model --variant tool` builds the "
                              f"tiny one with them), or format hermes")
    compile_config(spec, "local", check_paths=False, check_memory=False)  # not looked at without the paths check
    spec.write_text(spec.read_text().replace("enable = true", "enable = false"))  # nor while enable is false
    assert not _compile(spec)[0].experiment.rollout.multi_turn.enable


def test_a_template_without_a_tool_role_is_refused(tmp_path, random_tiny):
    hermes = _model(tmp_path / "hermes", random_tiny, hermes_tokenizer())  # the ChatML test tokenizer: accepted
    compiled, notes = _compile(_spec(tmp_path / "hermes", random_tiny, hermes, 'format = "hermes"\n'))
    assert compiled.experiment.rollout.multi_turn.format == "hermes" and not [n for n in notes if "multi_turn" in n]
    tok = hermes_tokenizer()
    tok.chat_template = NO_TOOL_ROLE
    model = _model(tmp_path, random_tiny, tok)
    spec = _spec(tmp_path, random_tiny, model)
    assert _refusal(spec) == (f"{spec}: model.path: {model}: the chat template has no 'tool' role: it drops a tool "
                              f"message's content, so the model would never see its tools' answers; allowed: a "
                              f"tokenizer whose chat template renders 'tool' messages")


def test_the_tokenizer_path_is_the_one_checked(tmp_path, random_tiny):
    tok = hermes_tokenizer()
    tok.chat_template = NO_TOOL_ROLE
    other = tmp_path / "tok"
    tok.save_pretrained(other)
    model = _model(tmp_path, random_tiny, hermes_tokenizer())
    spec = _spec(tmp_path, random_tiny, model)
    spec.write_text(spec.read_text().replace('dtype = "float32"', f'dtype = "float32"\ntokenizer_path = "{other}"'))
    assert f"model.tokenizer_path: {other}: the chat template has no 'tool' role" in _refusal(spec)


def test_a_closing_marker_of_several_tokens_is_named_in_a_warning(tmp_path, random_tiny):
    """</tool_call> written in characters: the run works (each turn runs to EOS, as verl's), and compile says so."""
    tok = _char_tokenizer(("<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"), HERMES_CHARS + "<>/",
                          ("<tool_response>", "</tool_response>"), 96, eos_token="<|im_end|>",
                          pad_token="<|endoftext|>", unk_token="<unk>")
    tok.chat_template = hermes_tokenizer().chat_template
    model = _model(tmp_path, random_tiny, tok)
    _, notes = _compile(_spec(tmp_path, random_tiny, model))
    assert [n for n in notes if "multi_turn" in n] == [
        f"{tmp_path / 'exp.toml'}: rollout.multi_turn.max_parallel_calls: max_parallel_calls = 1 but </tool_call> is "
        f"not one token of the tokenizer: a turn cannot stop at the end of its call and runs to EOS; only its first "
        f"call runs ({model})"]
    _, notes = _compile(_spec(tmp_path, random_tiny, model, "max_parallel_calls = 2\n"))
    assert not [n for n in notes if "multi_turn" in n]


def test_load_tokenizer_refusals(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "NotATokenizer"}')
    with pytest.raises(TokenizerNotLoaded, match="has no tokenizer.json and its tokenizer_config.json names no "
                                                 "tokenizer class of transformers \\('NotATokenizer'\\)"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"auto_map": {"AutoTokenizer": ["t.MyTok", null]}}')
    with pytest.raises(TokenizerNotLoaded) as err:
        load_tokenizer(tmp_path)
    assert err.value.skipped
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    (tmp_path / "tokenizer.json").write_text("{oops")
    with pytest.raises(TokenizerNotLoaded, match="cannot be loaded"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("make", [lambda: tiny.build_tokenizer("tool"), hermes_tokenizer])
def test_the_login_node_tokenizer_is_the_jobs(tmp_path, make):
    """What compile loads is what the job's AutoTokenizer loads: the class, the chat template, the ids of a tool
    turn (and so every check gives the job's answer)."""
    from transformers import AutoTokenizer

    from hpcppo.agent.tool_turns import ToolTurns

    make().save_pretrained(tmp_path)
    here, job = load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    assert type(here) is type(job) and here.chat_template == job.chat_template
    assert (ToolTurns(here, max_tool_response_length=8).ids(["12", "3"])
            == ToolTurns(job, max_tool_response_length=8).ids(["12", "3"]))
