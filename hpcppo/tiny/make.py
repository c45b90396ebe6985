"""Build the tiny model directory (and the task's Parquet data) once, atomically, and read it back.

``build_tiny_model_and_data`` is idempotent: when ``out_dir`` (and ``data_dir``) already hold a
build with the same settings hash, it returns the recorded summary without importing torch. A build
runs on one torch thread and is bit-reproducible on one machine; another machine's CPU kernels round
differently, so its weights and accuracies differ a little (both warm-start stages run to convergence
so that they stay in the band PPO needs, see :mod:`.warmstart`). It is written with
``save_pretrained`` (model, tokenizer, generation config) plus ``hpcppo_tiny.json`` with the measured
accuracies into a temporary directory that is fsynced and then renamed into place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from hpcppo.data import synthetic
from hpcppo.errors import ConfigError, PathError
from hpcppo.fsutil import fsync_dir as _fsync_dir
from hpcppo.fsutil import require_distinct, require_output_dir
from hpcppo.tiny.model import accuracy, build_model
from hpcppo.tiny.settings import FORMAT_VERSION, TinySettings
from hpcppo.tiny.tokenizer import build_tokenizer
from hpcppo.tiny.tool_warmstart import tool_accuracy, warm_start_calls
from hpcppo.tiny.warmstart import add_flaw, warm_start

INFO_FILE = "hpcppo_tiny.json"


MAX_ROWS = 1_000_000  # rows per split; the default run reads 4096


def build_tiny_model_and_data(
    out_dir: str | os.PathLike[str],
    data_dir: str | os.PathLike[str] | None = None,
    *,
    seed: int = 0,
    train_size: int = 4096,
    val_size: int = 512,
    force: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """Build (or find up to date) the tiny model in ``out_dir`` and the task data in ``data_dir``.

    ``overrides`` are ``TinySettings`` fields (e.g. ``max_operand=49``). Returns the summary recorded
    in ``out_dir/hpcppo_tiny.json`` plus ``"built"`` (False when the model was up to date) and
    ``"data"`` (the Parquet paths, when ``data_dir`` is given). Raises ``ConfigError`` for an
    unknown or bad setting and ``PathError`` when ``out_dir`` exists but is not a tiny-model build
    (it is never deleted then).
    """
    fields = [f.name for f in dataclasses.fields(TinySettings) if f.name != "seed"]
    for key in overrides:
        if key not in fields:
            raise ConfigError(f"unknown tiny-model setting; allowed: {', '.join(fields)}", key=key)
    if "operators" in overrides:
        overrides["operators"] = tuple(overrides["operators"])
    settings = TinySettings.of(seed=seed, **overrides)
    for option, size in (("--train-size", train_size), ("--val-size", val_size)):
        if not 1 <= size <= MAX_ROWS:
            # Rows are drawn with repetition from a small pool: more than this only costs time, memory and disk.
            raise ConfigError(f"{size:,} rows: the task ({settings.describe_task()}) has {settings.distinct_problems():,} "
                              f"distinct problems, drawn with repetition; allowed: 1 to {MAX_ROWS:,} rows", key=option)
    out_dir = Path(out_dir)
    check_outputs(out_dir, data_dir)  # before anything is written: a refused --out leaves no data behind

    info = _read_info(out_dir)
    if out_dir.exists() and info is None and any(out_dir.iterdir()):
        raise PathError(f"{out_dir} exists and is not a tiny-model build (no readable {INFO_FILE}); "
                        "choose another --out or remove it")

    built_variant = (info or {}).get("settings", {}).get("variant", "arith")
    if info is not None and not force and built_variant != settings.variant:
        raise PathError(f"{out_dir} holds the {built_variant} variant's build, not the {settings.variant} variant's; "
                        "choose another --out, or --force to replace it")

    data_paths: dict[str, str] = {}
    if data_dir is not None:
        data_dir = Path(data_dir)
        digest = _data_digest(settings, train_size, val_size)
        if force or not all(_parquet_digest(data_dir / f"{s}.parquet") == digest for s in ("train", "val")):
            data_paths = write_task_data(data_dir, settings=settings, train_size=train_size, val_size=val_size)
        else:
            data_paths = {s: str(data_dir / f"{s}.parquet") for s in ("train", "val")}

    if not force and info is not None and info.get("settings_hash") == settings.digest():
        return {**info, "built": False, "data": data_paths}
    info = _build_model_dir(out_dir, settings)
    return {**info, "built": True, "data": data_paths}


def check_outputs(out_dir: str | os.PathLike[str], data_dir: str | os.PathLike[str] | None = None,
                  reward_dir: str | os.PathLike[str] | None = None) -> None:
    """``PathError`` unless every output directory of a build can be made and written, and each is its own (a model
    directory is replaced whole when rebuilt: data inside it would go with it)."""
    require_output_dir(out_dir, "--out")
    if data_dir is not None:
        require_output_dir(data_dir, "--data-out")
    if reward_dir is not None:
        require_output_dir(reward_dir, "--reward-out")
    require_distinct({"--out": out_dir, "--data-out": data_dir, "--reward-out": reward_dir})


def write_task_data(
    data_dir: str | os.PathLike[str], *, settings: TinySettings, train_size: int, val_size: int
) -> dict[str, str]:
    """``train.parquet`` and ``val.parquet`` of the task under ``data_dir`` (atomic); returns their paths."""
    data_dir = Path(data_dir)
    meta = {"hpcppo_settings": _data_digest(settings, train_size, val_size)}
    paths = {}
    for split, n in (("train", train_size), ("val", val_size)):
        rows = settings.generate_rows(n, seed=settings.seed, split=split)
        paths[split] = str(synthetic.write_split(data_dir / f"{split}.parquet", rows, metadata=meta))
    return paths


def _build_model_dir(out_dir: Path, settings: TinySettings) -> dict[str, Any]:
    import torch

    t0 = time.perf_counter()
    # One thread: a 0.5M model gains nothing from more (on a busy 2-core machine two threads were 10x
    # slower than one), and the build is bit-reproducible on this machine whatever its core count.
    # It does not make machines agree: their kernels (AVX-512, AVX2, ...) round differently.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokenizer = build_tokenizer(settings.variant)
        model = build_model(tokenizer, settings)
        held_out = settings.generate_rows(512, seed=settings.seed + 2_000_003, split="val")
        seen = settings.generate_rows(512, seed=settings.seed + 4_000_037, split="train")
        if settings.variant == "tool":
            stages = {"task_stage": warm_start_calls(model, tokenizer, settings)}
            measure: Any = tool_accuracy
        else:
            stages = {"task_stage": warm_start(model, tokenizer, settings),
                      "flaw_stage": add_flaw(model, tokenizer, settings)}
            measure = accuracy
        kw = {"seed": settings.seed, "max_new_tokens": settings.max_new_tokens}
        measured = {
            "greedy_accuracy": measure(model, tokenizer, held_out, greedy=True, **kw),
            "sampled_accuracy": measure(model, tokenizer, held_out, greedy=False, **kw),
            # training-pool prompts, as in train.parquet: where PPO's reward starts
            "train_greedy_accuracy": measure(model, tokenizer, seen, greedy=True, **kw),
            "train_sampled_accuracy": measure(model, tokenizer, seen, greedy=False, **kw),
        }
        if settings.variant == "tool":  # the same model with the tool disabled: what it knows without it
            measured["train_sampled_accuracy_without_tool"] = tool_accuracy(model, tokenizer, seen, greedy=False,
                                                                            use_tool=False, **kw)
    finally:
        torch.set_num_threads(threads)
    info = {
        "format": FORMAT_VERSION,
        "settings_hash": settings.digest(),
        "settings": dataclasses.asdict(settings),
        "seed": settings.seed,
        "task": {"data_source": settings.data_source, **settings.task_kwargs()},
        "architecture": settings.architecture,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "warm_start": {**measured, "eval_prompts": len(held_out), **stages},
        "build_seconds": round(time.perf_counter() - t0, 2),
    }
    text = json.dumps(info, indent=2, sort_keys=True) + "\n"
    info = json.loads(text)  # what a later up-to-date call reads back (tuples become lists)
    save_model_dir(model, tokenizer, out_dir, INFO_FILE, text)
    return info


def save_model_dir(model: Any, tokenizer: Any, out_dir: Path, info_name: str, info_text: str) -> None:
    """Write a model directory atomically: model, tokenizer and ``info_name`` into a temporary sibling, fsynced,
    then moved to ``out_dir`` (replacing an outdated build); a failure leaves ``out_dir`` as it was."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f"{out_dir.name}.tmp-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _pin_tokenizer_class(tmp)
        (tmp / info_name).write_text(info_text)
        _fsync_tree(tmp)
        _install_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _pin_tokenizer_class(model_dir: Path) -> None:
    """Name ``PreTrainedTokenizerFast`` in tokenizer_config.json so AutoTokenizer loads tokenizer.json as is."""
    path = model_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _install_dir(tmp: Path, out_dir: Path) -> None:
    """Move the finished ``tmp`` build to ``out_dir``, replacing an outdated build (or empty dir) there."""
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f"{out_dir.name}.old-{os.getpid()}-{time.time_ns()}")
        os.replace(out_dir, old)
    try:
        os.replace(tmp, out_dir)
    except OSError:
        # A concurrent builder installed first: keep theirs (it raced us with the same request).
        shutil.rmtree(tmp, ignore_errors=True)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(out_dir.parent)


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(root)


def _read_info(out_dir: Path) -> dict[str, Any] | None:
    try:
        info = json.loads((out_dir / INFO_FILE).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def read_info(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``hpcppo_tiny.json`` summary of a built model directory; ``PathError`` if it is missing."""
    info = _read_info(Path(model_dir))
    if info is None:
        raise PathError(f"{model_dir} has no readable {INFO_FILE}: build it with `hpcppo tools make-model --out {model_dir}`")
    return info


def settings_of(info: dict[str, Any]) -> TinySettings:
    """The ``TinySettings`` recorded in a build summary."""
    raw = dict(info["settings"])
    raw["operators"] = tuple(raw["operators"])
    return TinySettings(**raw)


def _data_digest(settings: TinySettings, train_size: int, val_size: int) -> str:
    payload = {"format": FORMAT_VERSION, "seed": settings.seed, "train": train_size, "val": val_size, **settings.task_kwargs()}
    if settings.variant != "arith":
        payload["variant"] = settings.variant
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _parquet_digest(path: Path) -> str | None:
    try:
        return synthetic.read_metadata(path).get("hpcppo_settings")
    except (OSError, ValueError):
        return None
