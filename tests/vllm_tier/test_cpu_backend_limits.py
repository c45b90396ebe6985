"""What vLLM's CPU backend refuses, shown with vLLM's own error: the ground for compile's one-line refusal of
``rollout.free_cache_engine = true`` on CPU sites (hpcppo/config/resolve.py, tests/unit/test_vllm_cpu_compile.py)."""

from __future__ import annotations

import pytest
from _engines import vllm_engine


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_mode_is_refused_by_vllm_on_cpu(warm_tiny, level):
    root, _ = warm_tiny
    with pytest.raises(ValueError, match="Sleep mode is not supported on current platform"):
        vllm_engine(root / "model", enable_sleep_mode=True, sleep_level=level)
