"""[rollout.multi_turn]: verl's names, the tools checked at compile without torch (one line per problem), what is
not available yet (interaction turns) refused in one line, and keys that do nothing while enable is false named in a
warning."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from hpcppo.compiler import compile_config
from hpcppo.config import load_resolved, write_resolved
from hpcppo.errors import ConfigError, SettingWarning

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = (REPO / "examples" / "arith-tiny.toml").read_text()


def _base(tiny: dict[str, Path]) -> str:
    """A small spec whose model and data exist (compile checks the tools with the paths)."""
    return textwrap.dedent(f"""\
        name = "tools"
        [model]
        path = "{tiny['model']}"
        dtype = "float32"
        [data]
        train_files = ["{tiny['train']}"]
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
        """)

TOOLS_PY = textwrap.dedent("""
    from hpcppo.agent.tool import Tool

    class Echo(Tool):
        default_schema = {"type": "function", "function": {"name": "echo", "description": "echo", "parameters": {
            "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}

        def execute(self, instance_id, parameters):
            return parameters["text"], 0.0, {}

    class NoSchema(Tool):
        pass
""")


@pytest.fixture()
def user_tools(tmp_path, monkeypatch, random_tiny):
    (tmp_path / "my_tools.py").write_text(TOOLS_PY)
    (tmp_path / "broken_tools.py").write_text("import not_a_module_hpcppo\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "base.toml").write_text(_base(random_tiny))
    return tmp_path


def _compile(tmp_path: Path, section: str, *overrides: str):
    spec = tmp_path / "exp.toml"
    spec.write_text((tmp_path / "base.toml").read_text() + "\n" + textwrap.dedent(section))
    return compile_config(spec, "local", list(overrides), check_memory=False)


def _error(tmp_path: Path, section: str, *overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        _compile(tmp_path, section, *overrides)
    return str(err.value)


def test_tools_compile_with_verls_names_and_round_trip(tmp_path, user_tools):
    compiled = _compile(tmp_path, """
        [rollout.multi_turn]
        max_assistant_turns = 4
        max_parallel_calls = 2
        format = "compact"
        [[rollout.multi_turn.tools]]
        class_name = "hpcppo.agent.builtin.Calculator"
        [[rollout.multi_turn.tools]]
        class_name = "my_tools.Echo"
        config = {greeting = "hi"}
    """)
    mt = compiled.experiment.rollout.multi_turn
    assert (mt.enable, mt.max_assistant_turns, mt.max_parallel_calls, mt.format) == (False, 4, 2, "compact")
    assert [t.class_name for t in mt.tools] == ["hpcppo.agent.builtin.Calculator", "my_tools.Echo"]
    assert mt.tools[1].config == {"greeting": "hi"}
    resolved = tmp_path / "resolved.toml"
    write_resolved(compiled, resolved)
    assert "class_name = \"my_tools.Echo\"" in resolved.read_text()
    assert load_resolved(resolved).experiment.rollout.multi_turn == mt


@pytest.mark.parametrize("section, expect", [
    ('[[rollout.multi_turn.tools]]\nclass_name = "broken_tools.Echo"',
     "cannot import broken_tools: ModuleNotFoundError: No module named 'not_a_module_hpcppo'"),
    ('[[rollout.multi_turn.tools]]\nclass_name = "my_tools.Missing"', "module my_tools has no class Missing"),
    ('[[rollout.multi_turn.tools]]\nclass_name = "my_tools.NoSchema"', "no tool_schema given and the class has no"),
    ('[[rollout.multi_turn.tools]]\nclass_name = "my_tools.Echo"\ntool_schema = {type = "function", function = '
     '{name = "echo", description = "e", parameters = {type = "object", properties = {t = {type = "text"}}}}}',
     "bad tool_schema: function.parameters.properties.t.type must be one of string"),
    ('[[rollout.multi_turn.tools]]\nclass_name = "my_tools.Echo"\n[[rollout.multi_turn.tools]]\n'
     'class_name = "my_tools.Echo"', "tool name 'echo' is also tools[0]'s"),
    ('[[rollout.multi_turn.tools]]\nclass_name = "hpcppo.agent.builtin.PythonRunner"\n'
     'config = {wall_s = "10", memry_mb = 5, cpu_s = 0}',
     "bad config: config.wall_s must be a number; unknown config key 'memry_mb'; allowed: python, user, wall_s"),
    ('[rollout.multi_turn]\nformat = "compact"\n[[rollout.multi_turn.tools]]\nclass_name = "my_tools.Echo"\n'
     'tool_schema = {type = "function", function = {name = "my_echo", description = "e", parameters = {type = '
     '"object", properties = {text = {type = "array"}}}}}',
     "the compact format needs a tool name of lowercase letters, digits and '-' (not 'my_echo'); parameter 'text' "
     "is array"),
    ("[rollout.multi_turn]\nenable = true", "rollout.multi_turn.enable: multi-turn rollouts need tools"),
    ('[rollout.multi_turn]\ninteraction_config_path = "sim.yaml"', "interaction turns (verl's user simulator) are "
                                                                   "not supported yet"),
    ("[rollout.multi_turn]\nformat = \"json\"", "allowed values: \"hermes\", \"compact\""),
    ("[rollout.multi_turn]\nmax_paralel_calls = 2", "did you mean 'max_parallel_calls'?"),
])
def test_bad_multi_turn_settings_are_refused_in_one_line(tmp_path, user_tools, section, expect):
    message = _error(tmp_path, section)
    assert expect in message and "\n" not in message, message
    assert "exp.toml" in message


def test_each_bad_tool_has_its_own_line(tmp_path, user_tools):
    message = _error(tmp_path, '[[rollout.multi_turn.tools]]\nclass_name = "my_tools.Missing"\n'
                               '[[rollout.multi_turn.tools]]\nclass_name = "nope_hpcppo.Tool"\n')
    lines = message.splitlines()
    assert len(lines) == 2 and all("exp.toml: rollout.multi_turn.tools: tools[" in line for line in lines)


def test_without_the_paths_check_the_tools_are_not_imported(tmp_path):
    spec = tmp_path / "exp.toml"
    spec.write_text(EXAMPLE + '\n[[rollout.multi_turn.tools]]\nclass_name = "only_on_the_cluster.Tool"\n')
    compiled = compile_config(spec, "local", ["rollout.multi_turn.enable=true"], check_paths=False, check_memory=False)
    assert compiled.experiment.rollout.multi_turn.enable
    assert compiled.experiment.rollout.multi_turn.tools[0].class_name == "only_on_the_cluster.Tool"


def test_multi_turn_keys_without_enable_are_named_in_one_warning(tmp_path):
    spec = tmp_path / "exp.toml"
    spec.write_text(EXAMPLE + '\n[rollout.multi_turn]\nmax_assistant_turns = 3\n')
    with pytest.warns(SettingWarning) as got:
        compile_config(spec, "local", check_paths=False, check_memory=False)
    lines = [str(w.message) for w in got if "multi_turn" in str(w.message)]
    assert len(lines) == 1 and "rollout.multi_turn.max_assistant_turns" in lines[0] and "enable is false" in lines[0]
    spec.write_text(EXAMPLE + '\n[rollout.multi_turn]\nenable = true\nmax_assistant_turns = 3\n'
                              '[[rollout.multi_turn.tools]]\nclass_name = "hpcppo.agent.builtin.Calculator"\n')
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compile_config(spec, "local", check_paths=False, check_memory=False)
    assert not [w for w in seen if "multi_turn" in str(w.message)]


def test_verls_tool_config_yaml(tmp_path, user_tools):
    good = tmp_path / "tools.yaml"
    good.write_text(textwrap.dedent("""
        tools:
          - class_name: my_tools.Echo
            config: {type: native}
            tool_schema:
              type: function
              function: {name: echo2, description: d, parameters: {type: object, properties: {}, required: []}}
    """))
    mt = _compile(tmp_path, f'[rollout.multi_turn]\ntool_config_path = "{good}"').experiment.rollout.multi_turn
    assert mt.tool_config_path == str(good)
    bad = tmp_path / "bad.yaml"
    bad.write_text("tools:\n  - class_name: my_tools.Echo\n    config: {type: mcp}\n")
    assert "only native tools are supported" in _error(tmp_path, f'[rollout.multi_turn]\ntool_config_path = "{bad}"')
    bad.write_text("tools: 3\n")
    assert "needs a list `tools:`" in _error(tmp_path, f'[rollout.multi_turn]\ntool_config_path = "{bad}"')


def test_compile_checks_tools_without_importing_torch(tmp_path, random_tiny):
    spec = tmp_path / "exp.toml"
    spec.write_text(_base(random_tiny) + '\n[[rollout.multi_turn.tools]]\nclass_name = "hpcppo.agent.builtin.PythonRunner"\n')
    code = (f"import sys\nfrom hpcppo.compiler import compile_config\n"
            f"compile_config({str(spec)!r}, 'local', check_memory=False)\n"
            f"assert 'hpcppo.agent.builtin' in sys.modules\n"
            f"bad = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules]\nassert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
