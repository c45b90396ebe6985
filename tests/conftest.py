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
def random_tiny_rm(tmp_path_factory) -> Path:
    """An untrained tiny reward model (LlamaForSequenceClassification, one label) with the tiny tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from hpcppo.tiny import TinySettings, build_tokenizer

    root = tmp_path_factory.mktemp("random-tiny-rm") / "rm"
    tok, s = build_tokenizer(), TinySettings(seed=3)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
                      num_hidden_layers=s.num_layers, num_attention_heads=s.num_heads, num_key_value_heads=s.num_kv_heads,
                      max_position_embeddings=s.max_position_embeddings, pad_token_id=tok.pad_token_id)
    cfg.num_labels = 1
    torch.manual_seed(4)
    model = LlamaForSequenceClassification(cfg)
    with torch.no_grad():
        model.score.weight.normal_(0.0, 1.0)  # scores of order 1 that differ between responses
    model.save_pretrained(root)
    tok.save_pretrained(root)
    return root


@pytest.fixture(scope="session")
def warm_tiny(tmp_path_factory):
    """The warm-started tiny model of ``examples/arith-tiny.toml`` and its data (about a minute to build, once)."""
    from hpcppo.tiny import build_tiny_model_and_data

    root = tmp_path_factory.mktemp("warm-tiny")
    info = build_tiny_model_and_data(root / "model", root / "data", seed=0)
    return root, info
