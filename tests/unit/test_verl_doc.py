"""docs/verl.md is generated from the table the importer uses (regenerate: hpcppo import-verl --table > docs/verl.md)."""

from __future__ import annotations

from pathlib import Path

from hpcppo.verl import names as verl
from hpcppo.verl.importer import render_doc

DOC = Path(__file__).resolve().parents[2] / "docs" / "verl.md"


def test_the_committed_doc_is_the_generated_one():
    assert DOC.read_text() == render_doc(), "run: hpcppo import-verl --table > docs/verl.md"


def test_the_doc_has_a_row_for_every_entry():
    text = DOC.read_text()
    for e in verl.ENTRIES:
        assert f"| `{e.verl}{'.*' if e.prefix else ''}` |" in text, e.verl
