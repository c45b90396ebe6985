"""A model directory's tokenizer on the login node, without torch: for compile's look at what the tool loop needs
from it (hpcppo.agent.tool_turns).

The job loads it with ``AutoTokenizer.from_pretrained`` (hpcppo.train.build), but importing ``AutoTokenizer``
imports torch (transformers 5: ``models/auto/tokenization_auto`` imports ``configuration_utils``, which imports
``modeling_rope_utils``, which imports torch when it is installed). The tokenizer classes themselves do not: this
module takes the class that ``tokenizer_config.json`` names (``tokenizer_class``) from ``transformers`` directly, or
``PreTrainedTokenizerFast`` over ``tokenizer.json`` when it names none that transformers has, and loads it with the
class's own ``from_pretrained`` (the chat template, the added tokens and the special tokens as the job gets them).
A tokenizer of its own code (``auto_map``, ``trust_remote_code``) is not loaded here: the job checks it at start.
transformers is imported inside :func:`load_tokenizer` only (the other login-node commands stay without it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["load_tokenizer", "TokenizerNotLoaded"]


class TokenizerNotLoaded(Exception):
    """The directory's tokenizer cannot be loaded here: the reason, one line (the caller decides whether that is an
    error or only a check skipped)."""

    def __init__(self, message: str, *, skipped: bool = False):
        super().__init__(message)
        self.skipped = skipped  # True: a tokenizer of its own code, left to the job


def _config(directory: Path) -> dict[str, Any]:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerNotLoaded(f"{path} cannot be read as JSON: {getattr(exc, 'strerror', None) or exc}") from None
    return data if isinstance(data, dict) else {}


def load_tokenizer(directory: str | Path) -> Any:
    """The tokenizer of ``directory`` (a Hugging Face model or tokenizer directory), without importing torch.

    Raises :class:`TokenizerNotLoaded` (``skipped`` for a tokenizer of its own code) with one line."""
    directory = Path(directory)
    config = _config(directory)
    if isinstance(config.get("auto_map"), (dict, list)) and "AutoTokenizer" in json.dumps(config["auto_map"]):
        raise TokenizerNotLoaded(f"{directory} has a tokenizer of its own code (auto_map); the job checks it at start",
                                 skipped=True)
    import transformers  # the package's lazy module: no torch until a class that needs it is taken

    name = config.get("tokenizer_class")
    cls: Any = getattr(transformers, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(cls, type) or not hasattr(cls, "from_pretrained"):
        if not (directory / "tokenizer.json").is_file():
            raise TokenizerNotLoaded(f"{directory} has no tokenizer.json and its tokenizer_config.json names no "
                                     f"tokenizer class of transformers ({name!r})")
        cls = transformers.PreTrainedTokenizerFast
    try:
        return cls.from_pretrained(str(directory))
    except Exception as exc:  # noqa: BLE001 - any loading error: one line; the job would fail on it as well
        first = (str(exc).strip().splitlines() or [""])[0]
        raise TokenizerNotLoaded(f"the tokenizer of {directory} cannot be loaded ({cls.__name__}: "
                                 f"{type(exc).__name__}: {first})") from None
