from __future__ import annotations

import textwrap

import pytest

from hpcppo.compiler import compile_config
from hpcppo.errors import ConfigError


def _spec(tmp_path, fsdp: str):
    path = tmp_path / "exp.toml"
    path.write_text(textwrap.dedent("""\
        name = "x"
        [model]
        path = "/nonexistent/model"
        [data]
        train_files = ["/nonexistent/train.parquet"]
        [actor.fsdp]
        """) + fsdp)
    return path


def test_optimizer_offload_alone_compiles(tmp_path):
    """verl's optimizer_offload without param_offload: the state moves to the host between updates."""
    compiled = compile_config(_spec(tmp_path, "optimizer_offload = true\n"), "local", check_paths=False)
    fsdp = compiled.experiment.actor.fsdp
    assert fsdp.optimizer_offload and not fsdp.param_offload
    assert not compiled.experiment.critic.fsdp.optimizer_offload  # per model: the critic keeps its default


def test_optimizer_offload_must_be_a_boolean(tmp_path):
    with pytest.raises(ConfigError, match=r"actor\.fsdp\.optimizer_offload"):
        compile_config(_spec(tmp_path, 'optimizer_offload = "yes"\n'), "local", check_paths=False)


def test_optimizer_offload_with_param_offload_is_accepted(tmp_path):
    compiled = compile_config(_spec(tmp_path, "optimizer_offload = true\nparam_offload = true\n"), "local",
                              check_paths=False)
    assert compiled.experiment.actor.fsdp.param_offload
