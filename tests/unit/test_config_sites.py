"""Site profiles: lookup order, unknown sites, validation, and every shipped site and example."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcppo.compiler import compile_config
from hpcppo.config import available_sites, load_site, parse_slurm_time
from hpcppo.errors import ConfigError, SiteNotFoundError
from hpcppo.resources import resource_dir, sites_dir

SHIPPED = ["local", "local-slurm", "a100-cluster", "h100-cluster"]


def test_shipped_sites_load():
    assert set(SHIPPED) <= set(available_sites())
    local, dev, a100, h100 = (load_site(n) for n in SHIPPED)
    assert (local.scheduler, local.local.procs_per_node, local.gpus_per_node, local.paths.runs_root) == ("local", 2, 0, "runs")
    assert (dev.scheduler, dev.slurm.partition, dev.slurm.max_nodes, dev.slurm.gpus_per_node, dev.slurm.account,
            dev.slurm.max_time, dev.slurm.cpus_per_task) == ("slurm", "debug", 2, 0, "", "02:00:00", 1)
    assert (a100.slurm.gpus_per_node, a100.slurm.gpu_request, a100.slurm.constraint, a100.hdf5.locking,
            a100.slurm.exclusive, a100.slurm.signal_lead_s) == (8, "gpus-per-node", "a100", False, True, 900)
    assert a100.env.modules and a100.env.nccl["NCCL_IB_HCA"] and a100.env.setup
    assert (h100.slurm.gpu_request, h100.container.runtime) == ("gres", "pyxis")
    assert h100.container.image and h100.container.mounts


@pytest.mark.parametrize(("example", "site", "world"), [
    ("arith-tiny.toml", "local", 2),
    ("arith-tiny.toml", "local-slurm", 2),  # with -o resources.nodes=2: the dev cluster's 2 nodes x 1 rank
    ("gsm8k-qwen2.5-7b.toml", "a100-cluster", 16),
    ("gsm8k-qwen2.5-7b.toml", "h100-cluster", 16),
])
def test_shipped_examples_resolve(example, site, world):
    overrides = ["resources.nodes=2"] if site == "local-slurm" else []
    c = compile_config(resource_dir("examples") / example, site, overrides, check_paths=False)
    assert c.plan.world_size == world


def test_arith_tiny_paths_point_at_the_tiny_model_builder_output():
    c = compile_config(resource_dir("examples") / "arith-tiny.toml", "local", check_paths=False)
    root = resource_dir("examples").parent
    assert c.experiment.model.path == str(root / "artifacts" / "tiny-arith" / "model")
    assert c.experiment.data.train_files == [str(root / "artifacts" / "tiny-arith" / "data" / "train.parquet")]
    assert c.plan.needs_critic and c.experiment.rollout.n == 4 and c.experiment.model.dtype == "float32"


def test_unknown_site_lists_the_available_ones_with_a_suggestion():
    with pytest.raises(SiteNotFoundError) as info:
        load_site("a100-clustr")
    msg = str(info.value)
    assert msg.startswith("unknown site 'a100-clustr' (did you mean 'a100-cluster'?); available sites: ")
    for name in SHIPPED:
        assert name in msg
    assert info.value.exit_code == 3


def test_missing_site_file_path(tmp_path):
    with pytest.raises(SiteNotFoundError, match=r"nope\.toml: site file not found"):
        load_site(tmp_path / "nope.toml")


def test_lookup_order_env_then_user_then_packaged(tmp_path, monkeypatch):
    first, second, home = tmp_path / "a", tmp_path / "b", tmp_path / "home"
    for d in (first, second, home / ".config" / "hpcppo" / "sites"):
        d.mkdir(parents=True)
    (second / "local.toml").write_text('name = "local"\nscheduler = "local"\ndescription = "from b"\n')
    (home / ".config" / "hpcppo" / "sites" / "local.toml").write_text('name = "local"\nscheduler = "local"\n'
                                                                     'description = "from home"\n')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HPCPPO_SITES_DIR", f"{first}:{second}")
    assert load_site("local").description == "from b"
    monkeypatch.delenv("HPCPPO_SITES_DIR")
    assert load_site("local").description == "from home"
    (home / ".config" / "hpcppo" / "sites" / "local.toml").unlink()
    assert load_site("local").description == load_site(sites_dir() / "local.toml").description


@pytest.mark.parametrize(("text", "expected"), [
    ('scheduler = "pbs"', "scheduler: \"pbs\" is not allowed; allowed values: \"slurm\", \"local\""),
    ('[slurm]\nmax_time = "forever"', "slurm.max_time: 'forever' is not a Slurm time"),
    ('[slurm]\nmem_per_task = "120GB"', "slurm.mem_per_task: '120GB' is not a Slurm memory size"),
    ('[slurm]\ngpu_request = "gpu"', "slurm.gpu_request: \"gpu\" is not allowed"),
    ('[slurm]\nextra_directives = { "--mail-type" = "END" }', "is not an sbatch option name"),
    ('[slurm]\nextra_directives = { nodes = "3" }', "'nodes' is set by hpcppo"),
    ('[env]\nvars = { "BAD-NAME" = "1" }', "env.vars: 'BAD-NAME' is not a valid environment variable name"),
    ('[env]\nvars = { A = 1 }', "env.vars.A: expected a string, got 1 (an integer)"),
    ('[container]\nruntime = "pyxis"', "container.image: runtime = 'pyxis' needs an image"),
    ('[container]\nruntime = "apptainer"\nimage = "x.sif"\nmounts = ["/data"]', "container.mounts: '/data' is not a mount"),
    *[(f'[container]\nruntime = "apptainer"\nimage = "x.sif"\nextra_args = ["--bind", "/a:/a", "{arg}"]',
       f"container.extra_args: '{arg}' starts the ranks without the host environment")
      for arg in ("--cleanenv", "-e", "--containall", "-C", "-eC", "--cleanenv=true")],
    ('[slurm]\ncpus_per_task = 4\n[env]\nthreads_per_rank = 8',
     "env.threads_per_rank: 8 is more than slurm.cpus_per_task = 4 cores per rank"),
    ('[slurm]\npartiton = "x"', "slurm.partiton: unknown key (did you mean 'partition'?)"),
    # one holder for the bootstrap interface: env.socket_ifname renders NCCL's and gloo's variable
    ('[env]\nsocket_ifname = "ib0"\n[env.nccl]\nNCCL_SOCKET_IFNAME = "ib0"',
     "env.nccl: NCCL_SOCKET_IFNAME is set by env.socket_ifname"),
    ('[env.vars]\nGLOO_SOCKET_IFNAME = "ib0"', "env.vars: GLOO_SOCKET_IFNAME is set by env.socket_ifname"),
    ('[container]\nmonitor_python = "/v/bin/python"',
     "container.monitor_python: runs the watchdog monitor outside the container, and runtime = 'none' has none"),
    ('[env]\nsocket_ifname = "^docker"', "env.socket_ifname: '^docker' is not a list of interface names"),
])
def test_site_validation_messages(tmp_path, text, expected):
    p = tmp_path / "s.toml"
    p.write_text(f'name = "s"\n{text}\n')
    with pytest.raises(ConfigError) as info:
        load_site(p)
    assert str(info.value).startswith(f"{p}: ")
    assert expected in str(info.value)


@pytest.mark.parametrize("args", [["--writable-tmpfs"], ["--cleanenv=false"], ["--env", "A=1"], ["-B", "/a:/a"]])
def test_apptainer_args_that_keep_the_environment_pass(tmp_path, args):
    p = tmp_path / "s.toml"
    p.write_text(f'name = "s"\n[container]\nruntime = "apptainer"\nimage = "x.sif"\nextra_args = {args!r}\n'
                 .replace("'", '"'))
    assert load_site(p).container.extra_args == args


def test_pyxis_args_are_not_read_as_apptainer_flags(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('name = "s"\n[container]\nruntime = "pyxis"\nimage = "img"\nextra_args = ["-e"]\n')
    assert load_site(p).container.extra_args == ["-e"]


def test_site_templates_dir_is_relative_to_the_site_file(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('name = "s"\n[templates]\ndir = "my-templates"\n')
    assert load_site(p).templates.dir == str(tmp_path / "my-templates")


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 5400), ("05:30", 330), ("02:00:00", 7200), ("1-00:00:00", 86400), ("2-12", 216000), ("1-01:30", 91800),
])
def test_slurm_time_formats(text, seconds):
    assert parse_slurm_time(text) == seconds


def test_site_paths_in_defaults_are_relative_to_the_site_file(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('name = "s"\nscheduler = "local"\n[defaults]\nmodel.tokenizer_path = "tok"\n')
    assert load_site(p).defaults == {"model": {"tokenizer_path": str(tmp_path / "tok")}}


def test_site_names_shipped_match_their_files():
    for name in SHIPPED:
        assert load_site(name).name == name
        assert Path(available_sites()[name]).stem == name


def test_socket_ifname_renders_nccl_and_gloo_alike(tmp_path):
    from hpcppo.launch.render import environment_block

    p = tmp_path / "s.toml"
    p.write_text('name = "s"\n[env]\nsocket_ifname = "ib0,ib1"\n[env.nccl]\nNCCL_IB_HCA = "mlx5"\n')
    nccl = dict(environment_block(load_site(p))["nccl"])
    assert nccl == {"GLOO_SOCKET_IFNAME": "ib0,ib1", "NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "ib0,ib1"}
    p.write_text('name = "s"\n')
    assert dict(environment_block(load_site(p))["nccl"]) == {}
