"""No run-directory path is spelled outside ``hpcppo/rundir/``: the package's sources and the Jinja templates are
read for the run directory's file names, so that renaming one file of the protocol is a change in one place.

What counts as spelling a path, in Python (prose in docstrings, comments, messages and help texts is not a path):
- a string that contains no whitespace and holds one of :data:`NAMES` (``"run.json"``, ``f"exit-code.{a}"``,
  ``glob("attempt-*.h5")``);
- a directory name of the run joined to a path (``run_dir / "control"``, ``Path(run_dir, "logs")``,
  ``os.path.join(d, "metrics")``) or compared with a path's ``.name`` (``p.parent.name == "metrics"``).
In the templates, any occurrence of :data:`NAMES`: the renderer passes them as ``run_files``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from hpcppo.rundir import paths

ROOT = Path(__file__).resolve().parents[2]
OWNER = ROOT / "hpcppo" / "rundir"

# Distinctive names: never a word of prose without whitespace around it.
NAMES: tuple[str, ...] = (
    paths.SPEC, paths.RESOLVED, paths.SCRIPT, paths.RUN_JSON, paths.RUN_JSON_LOCK, paths.EVENTS, paths.PREFLIGHT,
    paths.EXIT_RECORD.rstrip("."), paths.LOG_DIR_PREFIX, paths.WATCHDOG_LOG, paths.LOCAL_CONTROLLER_LOG,
    "rank-", "slurm-", "step-", "COMMITTED",
)
# Names that are also words (``"PAUSED"`` is a run state too): only their use as a path counts.
DIRS: tuple[str, ...] = (*paths.SUBDIRS, paths.SUBMITIT, paths.TENSORBOARD, paths.WANDB, paths.REQUESTS, paths.DONE,
                         paths.REJECTED, paths.LOCK, paths.PAUSE, paths.PAUSED)
_NAME_RE = re.compile("|".join(re.escape(n) for n in NAMES))


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _leading_text(node: ast.AST) -> str | None:
    """The text a string expression starts with (a plain string, or an f-string's first literal part)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return None


def _is_dir_name(node: ast.AST) -> bool:
    text = _leading_text(node)
    return text is not None and (text in DIRS or text.split("/")[0] in DIRS)


def _callee(func: ast.AST) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def spelled_paths(source: str, filename: str = "<source>") -> list[str]:
    """``line: text`` of each run-directory path spelled in Python ``source``."""
    tree = ast.parse(source, filename)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if not any(c.isspace() for c in node.value) and _NAME_RE.search(node.value):
                found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _is_dir_name(node.right):
            found.append(f"{node.lineno}: / {_leading_text(node.right)!r}")
        elif isinstance(node, ast.Call) and _callee(node.func) in ("Path", "PurePath", "joinpath", "join"):
            found += [f"{node.lineno}: {_callee(node.func)}({_leading_text(a)!r})" for a in node.args if _is_dir_name(a)]
        elif isinstance(node, ast.Compare) and any(
                isinstance(side, ast.Attribute) and side.attr == "name" for side in [node.left, *node.comparators]):
            found += [f"{node.lineno}: .name == {_leading_text(s)!r}" for s in [node.left, *node.comparators]
                      if _is_dir_name(s)]
    return sorted(found, key=lambda hit: int(hit.split(":")[0]))


def test_no_module_outside_the_protocol_spells_a_run_directory_path() -> None:
    offences = []
    for path in sorted((ROOT / "hpcppo").rglob("*.py")):
        if OWNER in path.parents:
            continue
        offences += [f"{path.relative_to(ROOT)}:{hit}" for hit in spelled_paths(path.read_text(), str(path))]
    assert not offences, "run-directory paths built outside hpcppo/rundir:\n" + "\n".join(offences)


def test_templates_take_the_run_directory_names_from_the_renderer() -> None:
    offences = []
    for path in sorted((ROOT / "templates").rglob("*.j2")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            offences += [f"{path.relative_to(ROOT)}:{number}: {m.group(0)!r}" for m in _NAME_RE.finditer(line)]
    assert not offences, "run-directory names spelled in a template (use run_files):\n" + "\n".join(offences)


def test_the_check_sees_each_way_of_spelling_a_path() -> None:
    """The detector itself: each form it must catch, and prose it must leave alone."""
    caught = spelled_paths(
        'a = run / "control" / f"exit-code.{n}"\n'
        'b = sorted(d.glob("attempt-*.h5"))\n'
        'c = p.parent.name == "metrics"\n'
        'd = root / "checkpoints/step-3"\n'
        'e = Path(x) / "run.json"\n'
        'f = Path(x, "logs"), os.path.join(x, "control"), x.joinpath("submitit")\n')
    assert [hit.split(":")[0] for hit in caught] == ["1", "1", "2", "3", "4", "4", "5", "6", "6", "6"], caught
    assert spelled_paths('"""Reads run.json and control/PAUSED."""\n'
                         'def f():\n    """the exit-code file"""\n'
                         '    raise ValueError("no resolved.toml here")\n'
                         'status = "done"\n') == []
