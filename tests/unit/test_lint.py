"""Static checks that CI enforces: pyflakes on every Python file we own, shellcheck on every shell script."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_SCRIPTS = sorted(ROOT.glob("tools/*.sh")) + [ROOT / ".ci" / "run"]


def test_pyflakes_finds_nothing() -> None:
    """Unused imports, undefined names, shadowed loop variables: the bugs a reader should never have to spot."""
    proc = subprocess.run([sys.executable, "-m", "pyflakes", "hpcppo", "tools", "tests", "setup.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and not proc.stdout, proc.stdout + proc.stderr


def test_shell_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: tools/setup.sh installs it (apt package shellcheck)"
    assert len(SHELL_SCRIPTS) >= 5, SHELL_SCRIPTS
    proc = subprocess.run([shellcheck, "-S", "warning", *map(str, SHELL_SCRIPTS)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_test_modules_have_unique_names() -> None:
    """The test directories are not packages: pytest imports each test file by its base name, so two files of the
    same name in two tiers stop the whole collection ("import file mismatch")."""
    names: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {n: p for n, p in names.items() if len(p) > 1}
