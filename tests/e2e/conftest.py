"""End-to-end fixtures: a tiny offline model and synthetic data, and a launcher that runs the real job
entry point (``python -m hpcppo.train.main RUN_DIR``) as one subprocess per rank, the way srun or
submitit's local executor would."""

from __future__ import annotations


import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/e2e" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
