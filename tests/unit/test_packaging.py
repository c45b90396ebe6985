"""``templates/`` and ``sites/`` are found from the editable install and from a built wheel installed
in a fresh venv outside the checkout.

The wheel test builds the way CI and users do (``python -m build``: an sdist, then a wheel from the
unpacked sdist, which is where missing package data shows up) from a copy of the checkout's files, so
nothing is written into the shared checkout. The fresh venv has no pip and no torch: a ``.pth`` line
points at the project venv's site-packages for the dependencies (a directory named in a ``.pth`` file
is not scanned for further ``.pth`` files, so the project's editable hook is not loaded), and pip runs
from the project venv against it with ``--python``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

import hpcppo
from hpcppo import resources

REPO = Path(__file__).resolve().parents[2]
PACKAGED = ("hpcppo", "templates", "sites", "examples")
TOP_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE")


def _clean_env(home: Path) -> dict[str, str]:
    """No PYTHONPATH, no HPCPPO_* and a HOME without user site profiles."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{argv} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def _copy_sources(dest: Path) -> None:
    """The files a fresh checkout has (tracked, plus new files not ignored), without caches."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True, timeout=60).stdout.decode().split("\0")  # fmt: skip
    for rel in filter(None, listed):
        top = rel.split("/", 1)[0]
        src = REPO / rel
        if (top in PACKAGED or rel in TOP_FILES) and src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def test_editable_install_finds_the_checkout_resources(tmp_path):
    assert Path(hpcppo.__file__).resolve().is_relative_to(REPO), "the tests run against the checkout"
    assert resources.templates_dir() == REPO / "templates"
    assert resources.sites_dir() == REPO / "sites"
    assert resources.repo_root() == REPO
    # the console script works from any directory
    hpcppo_bin = Path(sys.executable).with_name("hpcppo")
    proc = _run([str(hpcppo_bin), "compile", str(REPO / "examples" / "arith-tiny.toml"), "--site", "local-slurm",
                 "--no-check-paths", "-q", "--runs-root", str(tmp_path / "runs")], tmp_path, _clean_env(tmp_path))  # fmt: skip
    [run] = (tmp_path / "runs").iterdir()
    assert (run / "job.sbatch").read_text().startswith("#!/bin/bash\n#SBATCH ")
    assert str(run) in proc.stderr


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_outside_the_checkout(tmp_path):
    src, dist, venv, work = tmp_path / "src", tmp_path / "dist", tmp_path / "venv", tmp_path / "elsewhere"
    for d in (src, work):
        d.mkdir()
    _copy_sources(src)
    env = _clean_env(tmp_path)
    # sdist, then the wheel from the unpacked sdist; no isolation: no network here (CI may isolate)
    _run([sys.executable, "-m", "build", "--no-isolation", "--skip-dependency-check", "--outdir", str(dist), str(src)],
         tmp_path, env)  # fmt: skip
    [wheel] = dist.glob("hpcppo-*.whl")
    [sdist] = dist.glob("hpcppo-*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    for rel in ("templates/slurm.sbatch.j2", "templates/partials/environment.j2", "templates/local.sh.j2",
                "sites/local.toml", "sites/local-slurm.toml", "sites/a100-cluster.toml", "examples/arith-tiny.toml"):  # fmt: skip
        assert f"hpcppo/_resources/{rel}" in names, f"{rel} missing from {wheel.name}"
    assert not any(n.startswith(("tests/", "templates/", "sites/")) for n in names), "resources belong under hpcppo/"
    with tarfile.open(sdist) as tar:
        assert any(n.endswith("/templates/slurm.sbatch.j2") for n in tar.getnames())

    # a fresh venv (no pip, no torch); dependencies from the project venv via a .pth line
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    vpy = venv / "bin" / "python"
    purelib = Path(_run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], work, env).stdout.strip())
    (purelib / "hpcppo-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "--no-deps", "--no-index", "-q", str(wheel)],
         tmp_path, env)  # fmt: skip

    probe = ("import json, hpcppo, hpcppo.resources as r; print(json.dumps({'pkg': hpcppo.__file__, "
             "'templates': str(r.templates_dir()), 'sites': str(r.sites_dir()), 'repo': r.repo_root()}))")  # fmt: skip
    found = json.loads(_run([str(vpy), "-c", probe], work, env).stdout)
    pkg_dir = purelib / "hpcppo"
    assert Path(found["pkg"]).parent == pkg_dir, f"imported {found['pkg']}, not the wheel's copy"
    assert found["templates"] == str(pkg_dir / "_resources" / "templates")
    assert found["sites"] == str(pkg_dir / "_resources" / "sites")
    assert found["repo"] is None

    # the wheel's console script compiles a run with its own templates and site profiles
    spec = work / "exp.toml"
    shutil.copy(pkg_dir / "_resources" / "examples" / "arith-tiny.toml", spec)
    hpcppo_bin = venv / "bin" / "hpcppo"
    assert hpcppo_bin.read_text().startswith(f"#!{vpy}")
    for site in ("local-slurm", "local"):
        runs = work / f"runs-{site}"
        _run([str(hpcppo_bin), "compile", str(spec), "--site", site, "--no-check-paths", "-q", "--runs-root", str(runs)],
             work, env)  # fmt: skip
        [run] = runs.iterdir()
        script = (run / "job.sbatch").read_text()
        # the job runs the interpreter of this venv (the site leaves env.python empty)
        assert f"{vpy} -u -m hpcppo.train.main {run}" in script
        assert f"site_file = \"{pkg_dir / '_resources' / 'sites' / f'{site}.toml'}\"" in (run / "resolved.toml").read_text()
    out = _run([str(hpcppo_bin), "config", "explain", "site.slurm.partition"], work, env).stdout
    assert "partition" in out
    # nothing was read from or written into the checkout
    assert not any(REPO.as_posix() in p for p in (found["pkg"], found["templates"], found["sites"]))
    assert os.path.commonpath([str(tmp_path), found["templates"]]) == str(tmp_path)
