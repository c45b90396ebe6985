"""Locate the top-level ``templates/``, ``sites/`` and ``examples/`` directories.

From a checkout (editable install) they sit next to the ``hpcppo`` package; from a wheel they are
package data under ``hpcppo/_resources``. No torch import here: the CLI uses this on login nodes.
"""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """Return the directory ``name`` (``templates``, ``sites`` or ``examples``)."""
    # From a checkout (pyproject.toml beside the package) the top-level directories are the truth; an
    # installed wheel uses only its own package data, never whatever sits next to it in site-packages.
    root = repo_root()
    candidates = [root / name] if root is not None else []
    candidates.append(_PKG / "_resources" / name)
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"hpcppo resource directory {name!r} not found next to {_PKG}")


def templates_dir() -> Path:
    return resource_dir("templates")


def sites_dir() -> Path:
    return resource_dir("sites")


def repo_root() -> Path | None:
    """The checkout root when running from one (it has ``pyproject.toml``), else None."""
    root = _PKG.parent
    return root if (root / "pyproject.toml").is_file() else None
