"""Fixtures shared by the e2e and Slurm tests."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest


def pytest_configure(config) -> None:  # noqa: ARG001
    """Run the suite with SIGINT as a terminal gives it, also from a background job (``nohup tools/test.sh &``
    starts with SIGINT ignored, and every process a test starts would inherit that across exec): the tests that
    press Ctrl-C on a child or cancel a local job (a SIGINT to its controller) need it. The product's own answer
    to an ignored SIGINT is tested in ``tests/unit/test_cli_local_preflight.py``."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def random_tiny(tmp_path_factory) -> dict[str, Path]:
    """An untrained ~0.5M-param tiny Llama + tokenizer and arithmetic data (seconds to build)."""
    from hpcppo.data import synthetic
    from hpcppo.tiny import TinySettings, build_model, build_tokenizer

    root = tmp_path_factory.mktemp("random-tiny")
    tok = build_tokenizer()
    model = build_model(tok, TinySettings(seed=3))
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    synthetic.write_split(root / "train.parquet", synthetic.generate_rows(256, seed=1, split="train", max_operand=19))
    synthetic.write_split(root / "val.parquet", synthetic.generate_rows(32, seed=2, split="val", max_operand=19))
    return {"model": root / "model", "train": root / "train.parquet", "val": root / "val.parquet"}




@pytest.fixture(scope="session")
def warm_tiny(tmp_path_factory):
    """The warm-started tiny model of ``examples/arith-tiny.toml`` and its data (about a minute to build, once)."""
    from hpcppo.tiny import build_tiny_model_and_data

    root = tmp_path_factory.mktemp("warm-tiny")
    info = build_tiny_model_and_data(root / "model", root / "data", seed=0)
    return root, info
