"""Export a committed checkpoint's actor as a Hugging Face directory (safetensors + tokenizer); with LoRA, the
merged model (``W + (alpha / r) B A`` under the base model's names, as the rollout engine gets it) and, in its
``lora_adapter/``, the adapters alone in peft's format (``PeftModel.from_pretrained(base_model, OUT/lora_adapter)``).

Runs in one process without a process group: DCP reads the sharded checkpoint into a plain model
whatever world size saved it. The model is built on the meta device and given storage (``loading.materialize``)
before DCP fills it: the base model's weights are never read, and the process holds one float32 copy of the
actor, the one it writes; no rank of the training job takes part. The output directory appears complete or not at
all (built beside it, then renamed). The checkpoint is verified first, shards' checksums included (it becomes a
model someone will use): a damaged one is one line naming the file (``CorruptCheckpointError``, a
``RunStateError``).
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Any

from hpcppo.errors import PathError, RunStateError
from hpcppo.rundir import RunPaths

ADAPTER_DIR = "lora_adapter"  # with LoRA: the adapters alone, in peft's format (verl's name for its copy)


def export_actor(run_dir: Path, out_dir: Path, step: int | None = None) -> dict[str, object]:
    # torch and transformers only when a model is exported: the CLI module that imports this one also serves
    # `tools make-model`, which returns without torch when its outputs are up to date.
    import torch
    from transformers import AutoTokenizer

    from hpcppo.config import load_resolved
    from hpcppo.distributed.checkpoint import CheckpointManager, CorruptCheckpointError
    from hpcppo.distributed.loading import materialize
    from hpcppo.distributed.weights import load_into
    from hpcppo.models import build_actor
    from hpcppo.models.lora import has_lora, merge_stream, save_adapter, scalings
    from hpcppo.train.lora import with_lora

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    compiled = load_resolved(RunPaths(run_dir).resolved)
    model_cfg = compiled.experiment.model
    manager = CheckpointManager(RunPaths(run_dir).checkpoints, keep_last=0, rank=0, world_size=1)
    committed = manager.list_committed()
    if not committed:
        raise RunStateError(f"run {run_dir.name} has no committed checkpoint to export")
    step = committed[-1] if step is None else step
    if step not in committed:
        raise RunStateError(f"no committed checkpoint at step {step}; committed steps: {committed}")
    if out_dir.exists():
        raise PathError(f"{out_dir} already exists; choose a new --out directory")
    try:
        manager.verify(step, shards=True)  # before the model is built: fail in a second, not after a minute
        # The model's structure only: its weights come from the checkpoint, so the base model's are not read.
        build = functools.partial(build_actor, model_cfg.path, dtype="float32",
                                  trust_remote_code=model_cfg.trust_remote_code)
        actor = with_lora(build, compiled.experiment.actor.lora)(empty=True)
        materialize(actor, torch.device("cpu"))
        manager.load(step, models={"actor": actor}, optimizers={}, restore_rng=False)
        adapted = actor if has_lora(actor) else None
        if adapted is not None:  # the merged weights, as the rollout engine gets them, into the plain model
            actor = build(empty=True)
            materialize(actor, torch.device("cpu"))
            load_into(actor, merge_stream(adapted.named_parameters(), scalings(adapted)))
    except CorruptCheckpointError as exc:
        older = [s for s in committed if s < step]
        raise CorruptCheckpointError(exc.path, exc.file, exc.reason, hint=(
            f"export an older one with --step {older[-1]}" if older else "no older committed checkpoint")) from None
    tokenizer = AutoTokenizer.from_pretrained(model_cfg.tokenizer_path or model_cfg.path,
                                              trust_remote_code=model_cfg.trust_remote_code)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        hf_actor: Any = actor  # a transformers PreTrainedModel: config and save_pretrained are not nn.Module's
        hf_actor.config.use_cache = True
        hf_actor.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if adapted is not None:  # and the adapters alone, in peft's format, for the base model
            save_adapter(adapted, tmp / ADAPTER_DIR, model_cfg.path)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"run": run_dir.name, "step": step, "out": str(out_dir)} | (
        {"adapter": str(out_dir / ADAPTER_DIR)} if adapted is not None else {})
