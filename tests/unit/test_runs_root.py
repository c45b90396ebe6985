"""One runs-root rule (``hpcppo.config.runs_root``): --runs-root > $HPCPPO_RUNS_ROOT > the site's paths.runs_root,
used alike by compile, preflight (the directory its job checks) and the commands that find a run."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from hpcppo import config
from hpcppo.cli import main
from hpcppo.config.compiled import RUNS_ROOT_ENV
from hpcppo.launch import jobs

REPO = Path(__file__).resolve().parents[2]
ARITH = REPO / "examples" / "arith-tiny.toml"


@pytest.fixture
def site(monkeypatch, tmp_path):
    monkeypatch.delenv(RUNS_ROOT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    return config.load_site("local")


def test_precedence_override_then_environment_then_site(site, tmp_path, monkeypatch):
    assert config.runs_root(site) == tmp_path / "runs"  # the site's "runs", relative to the current directory
    custom = attrs.evolve(site, paths=attrs.evolve(site.paths, runs_root="$HOME/site-runs"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert config.runs_root(custom) == tmp_path / "home" / "site-runs"
    monkeypatch.setenv(RUNS_ROOT_ENV, "~/env-runs")
    assert config.runs_root(custom) == tmp_path / "home" / "env-runs"
    assert config.runs_root(custom, "cli-runs") == tmp_path / "cli-runs"
    assert config.runs_root(custom, "cli-runs", cwd=tmp_path / "elsewhere") == tmp_path / "elsewhere" / "cli-runs"


@pytest.mark.parametrize("how", ["site", "environment", "option"])
def test_preflight_checks_the_directory_its_run_lives_in(site, tmp_path, monkeypatch, how):
    option = None
    if how == "environment":
        monkeypatch.setenv(RUNS_ROOT_ENV, str(tmp_path / "from-env"))
    elif how == "option":
        monkeypatch.setenv(RUNS_ROOT_ENV, str(tmp_path / "from-env"))  # the option wins over it
        option = "from-option"
    crun = jobs.compile_run(None, "local", runs_root=option, kind="preflight")
    expected = {"site": tmp_path / "runs", "environment": tmp_path / "from-env", "option": tmp_path / "from-option"}
    assert crun.run.path.parent == expected[how]
    assert crun.compiled.job.preflight_paths[0] == str(crun.run.path.parent)
    # ... and the commands that find runs look there too.
    assert main(["status", "--json", *(["--runs-root", option] if option else [])]) == 0


def test_compile_and_status_agree_on_the_environment_root(site, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(RUNS_ROOT_ENV, str(tmp_path / "shared"))
    assert main(["compile", str(ARITH), "--no-check-paths", "-q"]) == 0
    capsys.readouterr()
    assert main(["status", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert Path(row["path"]).parent == tmp_path / "shared"
