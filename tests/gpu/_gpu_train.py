"""One trainer rank started as the launchers start it (``hpcppo.train.main``), plus a probe of what it built.

    python tests/gpu/_gpu_train.py RUN_DIR PROBE_JSON [--recording-vllm]

After the job's entry point returns, the rank writes ``PROBE_JSON``: its exit code and, from the components the
trainer was built with, where each model's parameters and optimizer state lie (device, pinned) and the peak CUDA
memory. ``--recording-vllm`` installs ``tests/_fakes/recording_vllm`` as ``vllm`` first: a RECORDING STAND-IN, not
vLLM. The probe then lists what hpcppo asked of it, with the device and dtype of every weight it was sent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

FAKES = Path(__file__).resolve().parents[1] / "_fakes"


def _install_recording_vllm(weights_seen: list[dict[str, Any]]) -> Any:
    sys.path.insert(0, str(FAKES))
    import recording_vllm

    recording_vllm.install()
    real = recording_vllm._Model.load_weights

    def load_weights(self: Any, weights: Any) -> set[str]:
        def passing() -> Any:  # streamed on: the stand-in still sees the engine's own buckets
            for name, tensor in weights:
                weights_seen.append({"name": name, "device": tensor.device.type, "dtype": str(tensor.dtype)})
                yield name, tensor
        return real(self, passing())

    recording_vllm._Model.load_weights = load_weights
    return recording_vllm


def _where(tensors: list[Any]) -> dict[str, Any]:
    locals_ = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return {"devices": sorted({t.device.type for t in locals_}),
            "pinned": bool(locals_) and all(t.device.type == "cpu" and t.is_pinned() for t in locals_),
            "dtensor": bool(tensors) and all(hasattr(t, "to_local") for t in tensors)}


def _describe(c: Any) -> dict[str, Any]:
    import torch

    from hpcppo.distributed.weights import clean_name

    out: dict[str, Any] = {"device": str(c.device), "actor_optim_offload": c.actor.optim_offload,
                           "critic_optim_offload": c.critic.optim_offload if c.critic is not None else False,
                           "actor_names": [clean_name(n) for n, _ in c.actor.model.named_parameters()]}
    critic = c.critic
    for role, model in (("actor", c.actor.model), ("critic", critic and critic.model), ("reference", c.reference)):
        out[role] = None if model is None else _where([p.detach() for p in model.parameters()])
    for role, optim in (("actor_optim", c.actor.optim), ("critic_optim", critic and critic.optim)):
        moments = [] if optim is None else [v for s in optim.state.values() for k, v in s.items() if k != "step"]
        out[role] = _where(moments) | {"count": len(moments)}
    if c.device.type == "cuda":
        out["max_memory_allocated"] = torch.cuda.max_memory_allocated(c.device)
    return out


def main(argv: list[str]) -> None:
    from hpcppo.train import main as job
    from hpcppo.train import trainer

    run_dir, probe_path = argv[0], Path(argv[1])
    weights_seen: list[dict[str, Any]] = []
    fake = _install_recording_vllm(weights_seen) if "--recording-vllm" in argv[2:] else None
    built: list[Any] = []
    real_build = trainer.build_components

    def build_components(*args: Any, **kwargs: Any) -> Any:
        built.append(real_build(*args, **kwargs))
        return built[-1]

    trainer.build_components = build_components
    code = job.main([run_dir])
    probe: dict[str, Any] = {"code": code, "built": len(built)}
    if built:
        probe |= _describe(built[0])
    if fake is not None:
        probe["vllm_calls"] = fake.names()
        probe["weights_seen"] = weights_seen
    probe_path.write_text(json.dumps(probe, indent=1))
    job._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
