"""The login-node checks of ``[reward_model]`` (JSON reads only: no torch, no transformers): the directory holds a
classification model with one label whose positions fit ``max_length``, and a tokenizer with a chat template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpcppo.config.compiled import _model_config, _positions
from hpcppo.config.experiment import DataSection
from hpcppo.config.reward import RewardModelSection
from hpcppo.errors import ConfigError, PathError

__all__ = ["check_reward_model"]

#: The head classes a reward model's config.json may name: verl's yaml says "RM only supports
#: AutoModelForSequenceClassification", whose ``score`` head (no bias) its RewardModelWorker reads at every token
#: (AutoModelForTokenClassification, num_labels = 1). A token-classification checkpoint is refused: its head may carry
#: a bias that a sequence-classification build would drop.
_HEAD_SUFFIXES = ("ForSequenceClassification",)


def _read_json(key: str, path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PathError(f"{key}: {path.parent} has no {path.name}") from None
    except (OSError, ValueError) as exc:
        raise PathError(f"{key}: {path} cannot be read as JSON: {getattr(exc, 'strerror', None) or exc}") from None
    if not isinstance(data, dict):
        raise PathError(f"{key}: {path} is not a JSON object")
    return data


def _num_labels(config: dict[str, Any]) -> int:
    labels = config.get("id2label")
    if isinstance(labels, dict) and labels:
        return len(labels)
    value = config.get("num_labels")
    return value if isinstance(value, int) else 2  # transformers' PretrainedConfig default


def check_reward_model(section: RewardModelSection, data: DataSection) -> None:
    """On the login node: the reward model's directory holds a classification model with one label whose positions
    hold ``max_length`` tokens, and a tokenizer with a chat template (verl re-templates every (prompt, response) with
    it: ``_switch_chat_template`` in verl/workers/fsdp_workers.py, ``_preprocess_reward_inputs`` in
    verl/experimental/reward_loop/reward_loop.py)."""
    if not section.enable:
        return
    config = _model_config("reward_model.path", section.path)
    architectures = [str(a) for a in config.get("architectures") or []]
    if not any(a.endswith(_HEAD_SUFFIXES) for a in architectures):
        raise ConfigError(f"{section.path}/config.json names {', '.join(architectures) or 'no architectures'}; "
                          f"allowed: a *ForSequenceClassification model (a score head, as verl's reward model)",
                          key="reward_model.path")
    labels = _num_labels(config)
    if labels != 1:
        raise ConfigError(f"{section.path}/config.json has {labels} labels; allowed: 1 (verl reads one score per "
                          f"token, num_labels = 1)", key="reward_model.path")
    limit = _positions(config)
    longest = section.max_length or data.max_prompt_length + data.max_response_length
    if limit is not None and longest > limit[1]:
        what = "" if section.max_length else " (0: data.max_prompt_length + data.max_response_length)"
        raise ConfigError(f"{longest}{what} tokens, more than the reward model's {limit[0]} = {limit[1]} "
                          f"({section.path}/config.json); allowed: 1 to {limit[1]}", key="reward_model.max_length")
    _check_score_head(section.path)
    _check_tokenizer(section)


#: The first bytes of a .safetensors file: the length of its JSON header, little-endian (the format's definition).
_HEADER_LENGTH_BYTES = 8
_MAX_HEADER_BYTES = 100 << 20  # the safetensors library refuses larger headers too


def checkpoint_tensor_names(directory: str) -> list[str] | None:
    """The tensor names of the safetensors checkpoint in ``directory``, from its index (``weight_map``) or its file's
    JSON header: no tensor is read. None when it has neither (a ``.bin`` checkpoint) or they cannot be read."""
    root = Path(directory)
    try:
        index = root / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
            return sorted(weight_map) if isinstance(weight_map, dict) else None
        single = root / "model.safetensors"
        if not single.is_file():
            return None
        with single.open("rb") as f:
            length = int.from_bytes(f.read(_HEADER_LENGTH_BYTES), "little")
            if not 0 < length <= _MAX_HEADER_BYTES:
                return None
            header = json.loads(f.read(length))
        return sorted(k for k in header if k != "__metadata__") if isinstance(header, dict) else None
    except (OSError, ValueError):
        return None


def _check_score_head(directory: str) -> None:
    """The checkpoint holds a ``score`` head (``hpcppo.models.reward_model.RewardModel`` reads ``score`` at every
    position): encoder classifiers (BERT, RoBERTa, DeBERTa ...) name theirs ``classifier`` and would fail only when
    the job builds the model, after its queue wait."""
    names = checkpoint_tensor_names(directory)
    if names is None or "score.weight" in names:
        return
    heads = sorted({n.split(".")[0] for n in names if not n.startswith(("model.", "transformer.", "embed"))})
    found = ", ".join(heads[:5]) or "none"
    raise ConfigError(f"{directory}: the checkpoint has no score.weight (top-level tensors: {found}); allowed: a "
                      f"*ForSequenceClassification whose classification head is `score` (Llama, Qwen2, Mistral, "
                      f"Gemma ...), which hpcppo reads at every token as verl's reward model worker does",
                      key="reward_model.path")


def _check_tokenizer(section: RewardModelSection) -> None:
    tok_root = Path(section.tokenizer_path or section.path)
    key = "reward_model.tokenizer_path" if section.tokenizer_path else "reward_model.path"
    if not tok_root.is_dir():
        raise PathError(f"{key}: {tok_root} {'is not a directory' if tok_root.exists() else 'does not exist'} "
                        f"(a Hugging Face tokenizer directory is expected)")
    if not (tok_root / "tokenizer.json").is_file() and not (tok_root / "tokenizer.model").is_file():
        raise PathError(f"{key}: {tok_root} has no tokenizer (tokenizer.json or tokenizer.model)")
    tok_config = _read_json(key, tok_root / "tokenizer_config.json")
    if not tok_config.get("chat_template") and not (tok_root / "chat_template.jinja").is_file():
        raise ConfigError(f"{tok_root}: the reward model's tokenizer has no chat template; allowed: a tokenizer with "
                          f"one (verl applies it to every prompt and response before scoring)", key=key)
