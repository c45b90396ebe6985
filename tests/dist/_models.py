"""Tiny models and batches shared by the distributed tests (built identically on every rank from a seed)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


def tiny_config():
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=128, vocab_size=64, max_position_embeddings=64)


def tiny_lm(seed: int = 0) -> nn.Module:
    """Qwen2ForCausalLM with ~0.1M parameters; same weights on every rank for the same seed."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_config()).train()


class Critic(nn.Module):
    """The shape of our critic: an HF backbone plus a scalar value head. ``forward``: [B, T] ids -> [B, T] values."""

    def __init__(self, seed: int = 0):
        super().__init__()
        from transformers import Qwen2Model

        torch.manual_seed(seed)
        self.backbone = Qwen2Model(tiny_config())
        self.value_head = nn.Linear(self.backbone.config.hidden_size, 1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids).last_hidden_state
        # sum over the size-1 dim, not squeeze: FSDP2 warns when a root module returns a view.
        return self.value_head(hidden).sum(-1)


class PlainStack(nn.Module):
    """A non-HF model (no ``_no_split_modules``): layer discovery must fall back to the ModuleList."""

    def __init__(self, seed: int = 0, width: int = 16, depth: int = 3):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(32, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth))
        self.head = nn.Linear(width, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def batch(seed: int, n: int = 4, length: int = 12) -> torch.Tensor:
    """[n, length] token ids (no padding, so each rank's mean loss weighs tokens equally)."""
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(0, 64, (n, length), generator=g)


def lm_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


@contextlib.contextmanager
def disk_full_on_rank(failing_rank: int, rank: int) -> Iterator[None]:
    """Within the block, the checkpoint manager's durable writes raise ENOSPC on ``failing_rank`` only."""
    import hpcppo.distributed.checkpoint as ckpt

    real_write = ckpt.write_durable

    def failing_write(path, data):
        if rank == failing_rank:
            raise OSError(28, "No space left on device")
        real_write(path, data)

    ckpt.write_durable = failing_write
    try:
        yield
    finally:
        ckpt.write_durable = real_write
