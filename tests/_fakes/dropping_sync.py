"""A STAND-IN for a rollout engine whose weight sync is broken: not a real engine, and never proof that one works.

It is the project's real HF engine (:class:`hpcppo.rollout.hf.HFRolloutEngine`), except for one tensor: at
construction that tensor is filled as vLLM's dummy loader fills every weight (``load_format="dummy"``: uniform in
[-1e-3, 1e-3], vllm 0.32.0 ``model_executor/model_loader/weight_utils.py``, ``initialize_dummy_weights``), and each
``sync_weights`` drops the actor's copy of it, so the engine keeps the dummy values: the failure issue 37 found
for a mixture-of-experts model in vLLM, where the experts never received the actor's weights and nothing noticed.
Every drop is recorded in :data:`DROPPED`.

Run the job entry point with it: ``python tests/_fakes/dropping_sync.py TENSOR_NAME RUN_DIR`` (an empty name
drops nothing: the same path, healthy). It replaces :func:`hpcppo.train.build.build_engine` in that process only.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any

import torch

DROPPED: list[tuple[str, tuple[int, ...]]] = []
"""``(name, shape)`` of every tensor dropped from a sync, in order."""


class DroppingSyncEngine:
    """The HF engine with ``drop`` (a Hugging Face parameter name) never synced; everything else delegated."""

    def __init__(self, inner: Any, drop: str):
        self.inner, self.drop = inner, drop
        if drop:
            with torch.no_grad():
                inner._aliases[drop].uniform_(-1e-3, 1e-3)

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in named_tensors:
                if name == self.drop:
                    DROPPED.append((name, tuple(tensor.shape)))
                    print(f"dropping_sync stand-in: dropped {name} {tuple(tensor.shape)}", flush=True)
                    # the engine's own dummy values, as if nothing had arrived (the HF engine's own check of
                    # "every parameter written" is what a real engine's sync lacked)
                    yield name, self.inner._aliases[name].detach()
                else:
                    yield name, tensor
        return self.inner.sync_weights(stream())

    @property
    def sync_targets(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.inner.sync_targets.items() if k != self.drop}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def main(argv: list[str]) -> int:
    drop, run_dir = argv
    from hpcppo.train import build, main as entry

    real = build.build_engine

    def build_engine(kind: str, settings: Any) -> Any:
        return DroppingSyncEngine(real(kind, settings), drop)

    build.build_engine = build_engine  # type: ignore[assignment]
    entry._exit(entry.main([run_dir]))  # as the entry point leaves (no interpreter teardown)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
