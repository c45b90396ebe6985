"""-o key=value overrides (typed by the schema) and provenance: default < site < spec < override."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcppo.compiler import compile_config
from hpcppo.config import load_experiment, load_site, parse_overrides
from hpcppo.errors import ConfigError

BASE = """\
name = "t1"
[model]
path = "models/actor"
[data]
train_files = ["data/train.parquet"]
[trainer]
train_batch_size = 8
[actor]
ppo_mini_batch_size = 8
ppo_micro_batch_size_per_gpu = 2
"""


@pytest.fixture()
def spec(tmp_path: Path) -> Path:
    p = tmp_path / "exp.toml"
    p.write_text(BASE)
    return p


def test_typed_conversion_of_every_kind(spec, tmp_path):
    exp = load_experiment(spec, [
        "actor.lr=1e-6",  # float in exponent form
        "critic.lr=2",  # an integer is a fine float
        "trainer.train_batch_size=16",
        "model.trust_remote_code=True",  # booleans in any case
        "model.gradient_checkpointing=false",
        "model.attn_implementation=eager",  # strings need no quotes
        "description=\"quoted = kept\"",
        "actor.betas=[0.8, 0.95]",
        "actor.clip_ratio_high=0.28",
        "data.val_files=[\"v1.parquet\", \"v2.parquet\"]",
    ], )
    assert exp.actor.lr == 1e-6 and isinstance(exp.critic.lr, float) and exp.critic.lr == 2.0
    assert exp.trainer.train_batch_size == 16
    assert exp.model.trust_remote_code is True and exp.model.gradient_checkpointing is False
    assert exp.model.attn_implementation == "eager"
    assert exp.description == "quoted = kept"
    assert exp.actor.betas == [0.8, 0.95]
    assert exp.actor.clip_ratio_high == 0.28
    # Relative paths given on the command line are relative to the current directory.
    assert exp.data.val_files == [str(Path.cwd() / "v1.parquet"), str(Path.cwd() / "v2.parquet")]


def test_unset_optional_and_whole_section(spec):
    exp = load_experiment(spec, ["actor.clip_ratio_low=0.1", "actor.clip_ratio_low=none",
                                 "actor.fsdp={param_offload = true, reduce_dtype = \"bfloat16\"}"])
    assert exp.actor.clip_ratio_low is None
    assert exp.actor.fsdp.param_offload is True and exp.actor.fsdp.reduce_dtype == "bfloat16"
    assert exp.actor.fsdp.reshard_after_forward is True


def test_site_overrides_use_the_site_prefix(spec):
    exp_data, site_data = parse_overrides(["site.slurm.partition=short", "site.slurm.max_nodes=4",
                                           "site.env.vars={A = \"1\"}", "rollout.n=2"])
    assert site_data == {"slurm": {"partition": "short", "max_nodes": 4}, "env": {"vars": {"A": "1"}}}
    assert exp_data == {"rollout": {"n": 2}}
    site = load_site("local-slurm", ["slurm.partition=short", "site.slurm.max_nodes=4"])
    assert site.slurm.partition == "short" and site.slurm.max_nodes == 4


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("actor.lrr=1", "command line (-o): actor.lrr: unknown key (did you mean 'lr'?)"),
        ("actr.lr=1", "command line (-o): actr: unknown key (did you mean 'actor'?)"),
        ("site.slurm.partiton=x", "command line (-o): site.slurm.partiton: unknown key (did you mean 'partition'?)"),
        ("actor.lr=fast", "command line (-o): actor.lr: expected float, got 'fast'"),
        ("actor.lr=true", "command line (-o): actor.lr: expected a float, got true (a boolean)"),
        ("trainer.train_batch_size=1.5", "command line (-o): trainer.train_batch_size: expected an integer, got 1.5"),
        ("actor.clip_ratio_c=0.5", "command line (-o): actor.clip_ratio_c: 0.5 is out of range; must be > 1.0"),
        ("resources.nodes=0", "command line (-o): resources.nodes: 0 is out of range; must be >= 1"),
        ("actor.lr.x=1", "command line (-o): actor.lr: is a float, not a section with keys"),
        ("actor.lr", "command line (-o): 'actor.lr' is not key=value"),
        ("rollout.engine=vlm", "(did you mean 'vllm'?)"),
    ],
)
def test_override_errors(spec, override, expected):
    with pytest.raises(ConfigError) as info:
        compile_config(spec, "local", [override], check_paths=False)
    assert expected in str(info.value)


def test_later_override_wins(spec):
    exp = load_experiment(spec, ["actor.lr=1e-5", "actor.lr=3e-5"])
    assert exp.actor.lr == 3e-5


def test_provenance_records_every_layer(tmp_path, spec, monkeypatch):
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "lab.toml").write_text(
        'name = "lab"\nscheduler = "local"\n[local]\nprocs_per_node = 2\n'
        '[defaults]\nmodel.dtype = "float16"\nactor.lr = 5e-6\nactor.fsdp.param_offload = true\n')
    monkeypatch.setenv("HPCPPO_SITES_DIR", str(sites))
    spec.write_text(BASE.replace("ppo_mini_batch_size = 8", "ppo_mini_batch_size = 8\nlr = 7e-6"))
    c = compile_config(spec, "lab", ["actor.clip_ratio=0.3", "site.local.procs_per_node=4"], check_paths=False)
    prov = c.provenance
    assert (prov["actor.clip_ratio"], c.experiment.actor.clip_ratio) == ("override", 0.3)
    assert (prov["actor.lr"], c.experiment.actor.lr) == ("spec", 7e-6)  # spec beats the site's default
    assert (prov["model.dtype"], c.experiment.model.dtype) == ("site", "float16")
    assert (prov["actor.fsdp.param_offload"], c.experiment.actor.fsdp.param_offload) == ("site", True)
    assert (prov["actor.entropy_coeff"], c.experiment.actor.entropy_coeff) == ("default", 0.0)
    assert prov["name"] == "spec" and prov["watchdog.rules"] == "default"
    assert (prov["site.local.procs_per_node"], c.plan.ranks_per_node) == ("override", 4)
    assert prov["site.scheduler"] == "site" and prov["site.slurm.partition"] == "default"
    # An override beats the site's default too.
    c2 = compile_config(spec, "lab", ["model.dtype=bfloat16"], check_paths=False)
    assert (c2.provenance["model.dtype"], c2.experiment.model.dtype) == ("override", "bfloat16")


def test_site_default_errors_name_the_site_file(tmp_path, spec, monkeypatch):
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "bad.toml").write_text('name = "bad"\nscheduler = "local"\n[defaults]\nactor.lrr = 1e-6\n')
    (sites / "bad2.toml").write_text('name = "bad2"\nscheduler = "local"\n[defaults]\nactor.lr = "x"\n')
    monkeypatch.setenv("HPCPPO_SITES_DIR", str(sites))
    with pytest.raises(ConfigError) as info:
        compile_config(spec, "bad", check_paths=False)
    assert str(info.value).startswith(f"{sites / 'bad.toml'}: defaults.actor.lrr: unknown key (did you mean 'lr'?)")
    with pytest.raises(ConfigError) as info:
        load_site("bad2")
    assert str(info.value) == f'{sites / "bad2.toml"}: defaults.actor.lr: expected a float, got "x" (a string)'


def test_cross_field_error_from_an_override_layer_is_attributed(spec):
    # kl_ctrl.min_coef from the command line is checked against max_coef: the error names the override.
    with pytest.raises(ConfigError) as info:
        compile_config(spec, "local", ["algorithm.kl_ctrl.min_coef=50"], check_paths=False)
    assert str(info.value) == "command line (-o): algorithm.kl_ctrl.min_coef: 50.0 must be below max_coef 10.0"
