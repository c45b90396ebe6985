"""The import graph as a test: every import of every module under hpcppo/ (at the top of the module and inside
functions alike) is checked against the layer table of docs/architecture.md, which unit may import which and
which may import torch; an import inside a function is allowed only where DEFERRED says why."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hpcppo"
DOC = ROOT / "docs" / "architecture.md"
TORCH = ("torch", "transformers", "vllm")

#: Internal imports inside a function that stay there, and why. Everything else goes at the top of its module.
DEFERRED: dict[tuple[str, str], str] = {
    ("hpcppo.compiler", "hpcppo.data.check"): "pyarrow and numpy only when the data is checked: config show, plan "
                                              "and compile --no-check-paths stay without them",
    ("hpcppo.cli.configure", "hpcppo.data.dataset"): "pyarrow only when `plan` counts validation prompts: config "
                                                     "show and import-verl, in the same module, stay without it",
    **{("hpcppo.train.main", target): "the job entry point installs its preemption handler first: a signal that comes while torch and the models load is kept, not fatal"
       for target in ("hpcppo.config", "hpcppo.distributed.env", "hpcppo.train.preflight",
                      "hpcppo.train.trainer", "hpcppo.train.rollout_rank")},
    ("hpcppo.train.rollout_phase", "hpcppo.distributed.bridge"): "the bridge's store and process groups only in a "
                                                                  "split run (rollout.placement = \"split\")",
    **{("hpcppo.train.export", target): "torch only when a model is exported: cli.model, which imports this "
                                        "module, also serves `tools make-model`, torch-free when up to date"
       for target in ("hpcppo.config", "hpcppo.distributed.checkpoint", "hpcppo.distributed.loading",
                      "hpcppo.distributed.weights", "hpcppo.models", "hpcppo.models.lora", "hpcppo.train.lora")},
}
#: Modules of a torch-free unit that may import ``transformers`` (never torch or vLLM) inside a function, and why:
#: transformers' tokenizer classes load without torch (its ``AutoTokenizer`` does not: it is not used there).
#: tests/unit/test_cli_imports.py runs the command that reaches them and checks that torch stays out.
TRANSFORMERS_WITHOUT_TORCH: dict[str, str] = {
    "hpcppo.agent.tokenizer": "compile loads a multi-turn run's tokenizer to check its chat template and call "
                              "markers (the job's own check, hpcppo.agent.tool_turns) before the job starts",
}
#: Imports outside the table, until their package is reworked (an entry that no longer happens fails the test, so
#: that it is removed with the import).
OUTSIDE_TABLE: set[tuple[str, str]] = {
    ("watchdog", "launch"),  # the monitor: launch.slurm (cancels a hung job), launch.jobs, launch.runrecords (restarts a local one)
}
#: The trainer's and the watchdog's packages (and config/watchdog.py) are being reworked: their imports inside
#: functions are checked against the table but not yet moved to the top. Their number may only go down.
REWORKED = ("hpcppo.train", "hpcppo.watchdog", "hpcppo.config.watchdog")
REWORKED_DEFERRED_MAX = 9  # the monitor's (hpcppo/watchdog/monitor.py), all of them


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. hpcppo.cli.seeing
    target: str  # the imported module, e.g. hpcppo.analysis.logs
    line: int
    in_function: bool
    type_checking: bool


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def known_modules(root: Path = PACKAGE) -> set[str]:
    return {module_name(p) for p in root.rglob("*.py")}


def imports_of(source: str, module: str, is_package: bool, modules: set[str]) -> list[Import]:
    """Every import statement of ``source``, relative ones resolved, ``from X import name`` as ``X.name`` when that is
    a module of ours; whether it sits inside a function and under ``if TYPE_CHECKING:``."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            func = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            guarded = type_checking or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            if isinstance(child, ast.Import):
                found.extend(Import(module, a.name, child.lineno, in_function, type_checking) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([child.module] if child.module else []))
                for a in child.names:
                    target = f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    found.append(Import(module, target, child.lineno, in_function, type_checking))
            visit(child, func, guarded)

    visit(tree, False, False)
    return found


def all_imports() -> list[Import]:
    modules = known_modules()
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        out += imports_of(path.read_text(), module_name(path), path.name == "__init__.py", modules)
    return out


def layer_table(text: str) -> dict[str, tuple[set[str], str]]:
    """The table after the ``<!-- layers -->`` marker: unit -> (the units it may import, torch yes/no/lazily)."""
    after = text.split("<!-- layers:", 1)[1].split("\n\n", 1)[0]
    table = {}
    for row in after.splitlines()[3:]:
        unit_cell, may, torch = (c.strip() for c in row.strip().strip("|").split("|"))
        unit = re.findall(r"`([^`]+)`", unit_cell)[0]
        table[unit] = (set(re.findall(r"`([^`]+)`", may)), torch)
    return table


def unit_of(name: str, units: set[str]) -> str | None:
    """The most specific unit ``hpcppo.<unit>`` that ``name`` is or lies in (``hpcppo`` itself is a unit)."""
    if not (name == "hpcppo" or name.startswith("hpcppo.")):
        return None
    rest = name.removeprefix("hpcppo").removeprefix(".")
    best = "hpcppo" if "hpcppo" in units and not rest else None
    for unit in units:
        if unit != "hpcppo" and (rest == unit or rest.startswith(unit + ".")):
            if best is None or len(unit) > len(best):
                best = unit
    return best


@pytest.fixture(scope="module")
def table() -> dict[str, tuple[set[str], str]]:
    return layer_table(DOC.read_text())


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return all_imports()


def test_every_module_belongs_to_a_unit_of_the_table(table):
    units = set(table)
    assert [m for m in sorted(known_modules()) if unit_of(m, units) is None] == []
    named = {u for _, (may, _) in table.items() for u in may}
    assert named <= units, named - units
    assert {torch for _, torch in table.values()} <= {"yes", "no", "lazily"}


def test_every_import_of_ours_follows_the_layer_table(table, imports):
    units = set(table)
    outside = set()
    problems = []
    for imp in imports:
        src, dst = unit_of(imp.module, units), unit_of(imp.target, units)
        if dst is None or dst == src:
            continue
        if dst not in table[src][0]:
            outside.add((src, dst))
            if (src, dst) not in OUTSIDE_TABLE:
                problems.append(f"{imp.module}:{imp.line} imports {imp.target} ({src} -> {dst})")
    assert problems == []
    assert outside == OUTSIDE_TABLE, "an import listed outside the table is gone: remove it from OUTSIDE_TABLE"


def test_no_unit_without_torch_imports_torch_or_a_unit_with_it(table, imports):
    units = set(table)
    problems = []
    for imp in imports:
        src = unit_of(imp.module, units)
        torch = table[src][1]
        if imp.target.split(".")[0] in TORCH and not imp.type_checking:
            if imp.target == "transformers" and imp.module in TRANSFORMERS_WITHOUT_TORCH and imp.in_function:
                continue
            if torch == "no" or (torch == "lazily" and not imp.in_function):
                problems.append(f"{imp.module}:{imp.line} imports {imp.target}")
        dst = unit_of(imp.target, units)
        # torch "no" imports only "no" units; "lazily" may import "lazily" ones too (neither imports torch on import)
        allowed = {"no": {"no"}, "lazily": {"no", "lazily"}, "yes": {"no", "lazily", "yes"}}[torch]
        if dst is not None and dst != src and table[dst][1] not in allowed:
            problems.append(f"{imp.module}:{imp.line} imports {imp.target} (torch: {table[dst][1]})")
    assert problems == []


def test_imports_of_ours_are_at_the_top_of_their_module(imports):
    deferred = {(i.module, i.target) for i in imports if i.in_function and i.target.split(".")[0] == "hpcppo"}
    reworked = {d for d in deferred if d[0].startswith(REWORKED)}
    assert sorted(deferred - reworked - set(DEFERRED)) == []
    assert set(DEFERRED) <= deferred, "a deferred import is gone: remove it from DEFERRED"
    count = sum(1 for i in imports if i.in_function and i.module.startswith(REWORKED) and i.target.split(".")[0] == "hpcppo"
                and (i.module, i.target) not in DEFERRED)
    assert count <= REWORKED_DEFERRED_MAX


# ----------------------------------------------------------------------------- the detector itself
SAMPLE = '''
import os
from hpcppo.errors import PathError
from . import sibling
from ..launch import status
if TYPE_CHECKING:
    from hpcppo.config import Site

def f():
    from hpcppo.metrics import load
    import torch
    return load

class C:
    def g(self):
        from hpcppo import rundir
'''


def test_the_detector_sees_top_level_function_level_relative_and_guarded_imports():
    modules = {"hpcppo.analysis.sibling", "hpcppo.launch.status", "hpcppo.rundir", "hpcppo.metrics"}
    found = {(i.target, i.in_function, i.type_checking)
             for i in imports_of(SAMPLE, "hpcppo.analysis.x", False, modules)}
    assert found == {("os", False, False), ("hpcppo.errors", False, False), ("hpcppo.analysis.sibling", False, False),
                     ("hpcppo.launch.status", False, False), ("hpcppo.config", False, True),
                     ("hpcppo.metrics", True, False), ("torch", True, False), ("hpcppo.rundir", True, False)}


def test_units_and_the_table_are_read_as_written(table):
    units = set(table)
    assert unit_of("hpcppo.sizing.catalog", units) == "sizing.catalog"
    assert unit_of("hpcppo.sizing.estimate", units) == "sizing"
    assert unit_of("hpcppo.cli.export", units) == "cli.export" and unit_of("hpcppo.cli", units) == "cli"
    assert unit_of("hpcppo", units) == "hpcppo" and unit_of("numpy", units) is None
    assert table["rundir"] == ({"errors", "fsutil", "rule_actions"}, "no") and table["tiny"][1] == "lazily"


def test_a_forbidden_import_would_be_reported(table):
    """analysis importing the trainer: outside the table, and torch in a unit without it."""
    units = set(table)
    [imp] = imports_of("from hpcppo.train import trainer\n", "hpcppo.analysis.x", False, {"hpcppo.train.trainer"})
    src, dst = unit_of(imp.module, units), unit_of(imp.target, units)
    assert dst not in table[src][0] and table[src][1] == "no" and table[dst][1] == "yes"
