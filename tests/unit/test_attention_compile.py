"""Compile knows which ``model.attn_implementation`` a family supports (issue 37 item 6): from the installed
transformers' source as text, without importing torch or transformers. The default (sdpa) becomes eager, with
provenance, for a family without sdpa; a value the spec sets that the family lacks is refused in one line naming the
value that works. Gemma2 lost sdpa between transformers 5.19 and 5.25 ("sdpa does not support softcapping")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcppo.compiler import compile_config
from hpcppo.config.attention import attention_support
from hpcppo.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def model_dir(tmp_path: Path, model_type: str, architecture: str) -> Path:
    d = tmp_path / model_type
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": [architecture]}))
    return d


def spec(tmp_path: Path, model: Path, extra: str = "") -> Path:
    data = REPO / "tests" / "unit" / "verl_inputs"  # any existing file: the data is not read (see below)
    p = tmp_path / "exp.toml"
    p.write_text(f'name = "t"\n[model]\npath = "{model}"\ndtype = "float32"\n{extra}\n'
                 f'[data]\ntrain_files = ["{data / "grpo.yaml"}"]\n')
    return p


def settle(tmp_path: Path, model: Path, extra: str = ""):
    """compile_config's path checks with the data check stubbed (the attention check runs before it)."""
    import hpcppo.data.check as check

    real = check.check_experiment_data
    check.check_experiment_data = lambda experiment: None
    try:
        return compile_config(spec(tmp_path, model, extra), "local", check_memory=False)
    finally:
        check.check_experiment_data = real


def gemma2_has_sdpa() -> bool:
    from transformers import Gemma2ForCausalLM

    return Gemma2ForCausalLM._supports_sdpa


def test_gemma2_without_sdpa_gets_eager_by_default_with_the_reason(tmp_path):
    if gemma2_has_sdpa():
        pytest.skip("this transformers' Gemma2 supports sdpa (5.19); the .venv pins 5.25, which does not")
    compiled = settle(tmp_path, model_dir(tmp_path, "gemma2", "Gemma2ForCausalLM"))
    assert compiled.experiment.model.attn_implementation == "eager"
    why = compiled.provenance["model.attn_implementation"]
    assert why.startswith("default for gemma2: sdpa is not supported (transformers 5.")
    assert "Gemma2PreTrainedModel._supports_sdpa = False (models/gemma2/modeling_gemma2.py)" in why


def test_a_value_the_spec_sets_that_the_family_lacks_is_refused_in_one_line(tmp_path):
    if gemma2_has_sdpa():
        pytest.skip("this transformers' Gemma2 supports sdpa")
    with pytest.raises(ConfigError) as info:
        settle(tmp_path, model_dir(tmp_path, "gemma2", "Gemma2ForCausalLM"), 'attn_implementation = "sdpa"')
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("model.attn_implementation: \"sdpa\" is not supported by "
                                              "Gemma2ForCausalLM (transformers 5.")
    assert msg.endswith('; use "eager" (or flash_attention_2 / flash_attention_3 on GPUs)')


def test_a_family_with_sdpa_keeps_the_default_and_eager_is_always_allowed(tmp_path):
    qwen3 = model_dir(tmp_path, "qwen3_moe", "Qwen3MoeForCausalLM")
    compiled = settle(tmp_path, qwen3)
    assert compiled.experiment.model.attn_implementation == "sdpa"
    assert compiled.provenance.get("model.attn_implementation", "default") == "default"
    (tmp_path / "exp.toml").unlink()
    assert settle(tmp_path, qwen3, 'attn_implementation = "eager"').experiment.model.attn_implementation == "eager"


def test_unknown_families_and_remote_code_are_left_to_the_job(tmp_path):
    assert attention_support(model_dir(tmp_path, "no_such_family", "NoSuchForCausalLM")) is None
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "config.json").write_text(json.dumps({"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"],
                                                    "auto_map": {"AutoModelForCausalLM": "x.Y"}}))
    assert attention_support(remote) is None


def test_the_check_imports_neither_torch_nor_transformers(tmp_path):
    d = model_dir(tmp_path, "gemma2", "Gemma2ForCausalLM")
    code = ("import sys; from hpcppo.config.attention import attention_support; "
            f"s = attention_support({str(d)!r}); print(s.version, s.supports('eager')); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[1] == "True"
