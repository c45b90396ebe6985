"""Deterministic, resumable, data-parallel sampling of prompt batches.

Every rank computes the same permutation of the data set for an epoch from ``(seed, epoch)`` alone, takes the
same window of ``batch_size`` prompts from it (the *global* batch), and keeps its contiguous share
``[rank * B/dp, (rank+1) * B/dp)``. Ranks therefore partition each global batch without communicating.

The cursor counts *global prompts consumed in the current epoch*, not per-rank steps: a checkpoint written with
4 data-parallel ranks resumes on 2 (or with another batch size) at exactly the same place in the data.

No torch here (numpy only); the state is plain ints so ``torch.load(weights_only=True)`` reads it back.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from hpcppo.errors import ConfigError


class ShardedEpochSampler:
    """Yields this rank's share of each global batch of ``batch_size`` prompt indices.

    ``drop_last=True``: the prompts left over at the end of an epoch (fewer than ``batch_size``) are skipped.
    ``drop_last=False``: the last batch of an epoch is filled up with the first prompts of the same epoch's
    permutation, so every batch has exactly ``batch_size`` prompts (the PPO batch arithmetic never changes).

    Use ``for indices in sampler`` for the rest of the current epoch, or :meth:`next_batch` for an endless stream
    across epochs; both advance the cursor before handing a batch out, so a checkpoint taken after step k resumes
    at batch k+1.
    """

    def __init__(
        self,
        num_items: int,
        *,
        batch_size: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        for key, value, low in (("num_items", num_items, 1), ("batch_size", batch_size, 1), ("dp_size", dp_size, 1),
                                ("seed", seed, 0), ("dp_rank", dp_rank, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"must be an integer >= {low}, got {value!r}", key=key)
        if dp_rank >= dp_size:
            raise ConfigError(f"dp_rank {dp_rank} is not below dp_size {dp_size}", key="dp_rank")
        if batch_size % dp_size:
            raise ConfigError(f"batch_size {batch_size} is not divisible by the data-parallel size {dp_size}",
                              key="batch_size", hint=f"use a multiple of {dp_size}")
        if drop_last and num_items < batch_size:
            raise ConfigError(f"the data set has {num_items} prompts, fewer than one batch of {batch_size} "
                              "(with drop_last every epoch would be empty)", key="batch_size")
        self.num_items = num_items
        self.batch_size = batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.cursor = 0
        self._perm_epoch: int | None = None
        self._perm: np.ndarray | None = None

    @property
    def per_rank_batch_size(self) -> int:
        """Prompts per rank and step."""
        return self.batch_size // self.dp_size

    @property
    def steps_per_epoch(self) -> int:
        """Global batches in one epoch."""
        if self.drop_last:
            return self.num_items // self.batch_size
        return -(-self.num_items // self.batch_size)

    def epoch_permutation(self, epoch: int) -> np.ndarray:
        """The order of the data set in ``epoch``: identical on every rank, different per (seed, epoch)."""
        if self._perm_epoch != epoch:
            if self.shuffle:
                # SeedSequence mixes both numbers: seed s epoch e+1 is unrelated to seed s+1 epoch e.
                self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_items)
            else:
                self._perm = np.arange(self.num_items)
            self._perm_epoch = epoch
        assert self._perm is not None
        return self._perm

    def global_batch(self) -> list[int]:
        """The next global batch (all ranks' prompts), without advancing."""
        perm = self.epoch_permutation(self.epoch)
        window = perm[self.cursor: self.cursor + self.batch_size]
        if len(window) < self.batch_size:  # only with drop_last=False: fill from the start of this epoch's order
            window = np.concatenate([window, np.resize(perm, self.batch_size - len(window))])
        return [int(i) for i in window]

    def _advance(self) -> None:
        self.cursor += self.batch_size
        if self._epoch_done():
            self.epoch += 1
            self.cursor = 0

    def _epoch_done(self) -> bool:
        if self.drop_last:
            return self.cursor + self.batch_size > self.num_items
        return self.cursor >= self.num_items

    def next_batch(self) -> list[int]:
        """This rank's share of the next global batch (``batch_size / dp_size`` indices); moves across epochs."""
        batch = self.global_batch()
        self._advance()
        share = self.per_rank_batch_size
        return batch[self.dp_rank * share: (self.dp_rank + 1) * share]

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's batches for the rest of the current epoch."""
        epoch = self.epoch
        while self.epoch == epoch:
            yield self.next_batch()

    def __len__(self) -> int:
        """Batches left in the current epoch."""
        if self.drop_last:
            return (self.num_items - self.cursor) // self.batch_size
        return -(-(self.num_items - self.cursor) // self.batch_size)

    def skip(self, n_batches: int) -> None:
        """Move past ``n_batches`` global batches (crossing epochs), e.g. after a rollback to avoid replaying the
        batches that blew up."""
        if not isinstance(n_batches, int) or n_batches < 0:
            raise ValueError(f"skip needs a non-negative number of batches, got {n_batches!r}")
        for _ in range(n_batches):
            self._advance()

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "cursor"}`` as plain ints (cursor = global prompts consumed in this epoch)."""
        return {"epoch": int(self.epoch), "cursor": int(self.cursor)}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume from :meth:`state_dict` (possibly saved with another dp_size or batch_size)."""
        try:
            epoch, cursor = int(state["epoch"]), int(state["cursor"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"sampler state must have integer 'epoch' and 'cursor', got {dict(state)!r}",
                              key="data_cursor") from exc
        if epoch < 0 or not 0 <= cursor <= self.num_items:
            raise ConfigError(f"sampler state epoch={epoch} cursor={cursor} is out of range for a data set of "
                              f"{self.num_items} prompts (did the data set change?)", key="data_cursor")
        self.epoch, self.cursor = epoch, cursor
        if self._epoch_done():  # e.g. resumed with a larger batch_size: the remainder no longer fills a batch
            self.epoch += 1
            self.cursor = 0
