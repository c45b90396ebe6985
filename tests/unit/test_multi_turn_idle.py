"""Multi-turn keys set while ``rollout.multi_turn.enable`` is false do nothing: compile says so in one warning."""

from __future__ import annotations

import warnings
from pathlib import Path

from hpcppo.compiler import compile_config
from hpcppo.errors import SettingWarning

ARITH = Path(__file__).resolve().parents[2] / "examples" / "arith-tiny.toml"


def _warnings(*overrides: str) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compile_config(ARITH, "local", list(overrides), check_paths=False, check_memory=False)
    return [str(w.message) for w in caught if issubclass(w.category, SettingWarning)]


def test_multi_turn_keys_while_off_warn_once():
    [line] = _warnings("rollout.multi_turn.max_assistant_turns=3", "rollout.multi_turn.format=compact")
    assert line.startswith("rollout.multi_turn.format, rollout.multi_turn.max_assistant_turns: rollout.multi_turn."
                           "enable is false")
    assert _warnings("rollout.multi_turn.enable=false") == []
