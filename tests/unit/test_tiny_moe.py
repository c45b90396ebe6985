"""``hpcppo tools make-model --moe`` (issue 37 item 7), the cheap part: its options, and the dense build's settings
hash unchanged by the MoE fields. A MoE build and a run of it on the local default: ``tests/e2e/test_tiny_moe_run.py``."""

from __future__ import annotations

import pytest

from hpcppo.cli import main
from hpcppo.tiny.settings import TinySettings


def test_the_dense_build_keeps_the_hash_it_had_before_the_moe_settings():
    # the digest of TinySettings() as FORMAT_VERSION 2 computed it before the MoE fields existed: existing
    # artifacts/tiny-arith builds stay up to date
    assert TinySettings().digest() == "8979f41bee31d8da"
    assert TinySettings(moe_experts=4).digest() != TinySettings().digest()


@pytest.mark.parametrize(("args", "line"), [
    (["--experts", "8"], "hpcppo: error: --experts: needs --moe (the dense model has no experts)"),
    (["--moe", "--top-k", "5"], "hpcppo: error: --top-k: must be 2 to the number of experts (4), got 5"),
    (["--moe", "--experts", "1"], "hpcppo: error: --top-k: must be 2 to the number of experts (1), got 2"),
])
def test_bad_moe_options_are_one_line_and_write_nothing(tmp_path, capsys, args, line):
    argv = ["tools", "make-model", "--out", str(tmp_path / "m"), "--data-out", str(tmp_path / "d"), *args]
    assert main(argv) == 2
    assert capsys.readouterr().err == line + "\n"
    assert list(tmp_path.iterdir()) == []
