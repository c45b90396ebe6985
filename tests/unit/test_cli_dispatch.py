"""The parser names each command's function as ``"<module>:<function>"`` of :mod:`hpcppo.cli`: every name resolves,
the torch-bound command is the only one in :mod:`hpcppo.cli.export`, and make-model (torch only to build) is alone in
:mod:`hpcppo.cli.tools`."""

from __future__ import annotations

import argparse
import importlib

from hpcppo.cli import build_parser


def handlers(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], str]:
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.update(handlers(sub, (*prefix, name)))
    func = parser.get_default("func")
    if func is not None:
        out[prefix] = func
    return out


def test_every_command_names_a_function_that_exists():
    found = handlers(build_parser())
    assert len(found) == 22, sorted(found)
    for command, handler in found.items():
        module, name = handler.split(":")
        assert callable(getattr(importlib.import_module(f"hpcppo.cli.{module}"), name)), command


def test_only_export_and_make_model_live_with_torch():
    found = handlers(build_parser())
    assert [c for c, h in found.items() if h.startswith("export:")] == [("export",)]
    assert [c for c, h in found.items() if h.startswith("tools:")] == [("tools", "make-model")]
