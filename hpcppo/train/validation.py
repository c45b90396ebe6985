"""Validation statistics at ``n`` responses per prompt, with verl's names and numbers.

verl b178a3c, ``verl/trainer/ppo/metric_utils.py``: ``process_validation_metrics`` groups the validation samples by
data source and prompt (uid); per prompt it takes ``mean@n`` and ``std@n`` (numpy's population std) of the ``n``
scores and, for each subset size ``k`` of ``gen_ns`` (2, 4, ... below n, then n), a bootstrap of 1000 subsets of
``k`` scores drawn with replacement (``bootstrap_metric``: ``np.random.seed(42)``, then
``np.random.choice(n, size=(1000, k), replace=True)``): the mean and std over the subsets of their max
(``best@k``), min (``worst@k``) and, where the reward function returns a ``pred``, the score of the majority
answer (``calc_maj_val``: the most frequent pred, ties to the one seen first in the subset, and the score of its
first occurrence). Each statistic is then averaged over the prompts of the data source. verl's ``_val_metrics_update``
(``verl/trainer/ppo/ray_trainer.py``) logs them as ``val-core/<data_source>/reward/<stat>``; hpcppo logs them as
``val/score/<data_source>/<stat>`` (:func:`hpcppo.rundir.metric_names.validation_stats`).

The bootstrap draws from its own ``RandomState(42)``, the stream verl's global ``np.random.seed(42)`` gives, so the
numbers match verl's without touching numpy's global generator. No torch here.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from hpcppo.data.rewards import NO_PRED
from hpcppo.rundir.metric_names import bootstrap_sizes

N_BOOTSTRAP = 1000  # verl's n_bootstrap
BOOTSTRAP_SEED = 42  # verl's default seed of process_validation_metrics


def _bootstrap_indices(n_data: int, k: int) -> np.ndarray:
    # verl seeds the global generator before every bootstrap_metric call: each call draws the same indices.
    return np.random.RandomState(BOOTSTRAP_SEED).choice(n_data, size=(N_BOOTSTRAP, k), replace=True)


def majority_value(scores: Sequence[float], preds: Sequence[Hashable]) -> float:
    """The score of the first sample whose pred is the most frequent one (ties: the pred seen first), as verl's
    ``calc_maj_val``."""
    counts: dict[Hashable, int] = {}
    first: dict[Hashable, float] = {}
    for s, p in zip(scores, preds, strict=True):
        counts[p] = counts.get(p, 0) + 1
        first.setdefault(p, s)
    return first[max(counts, key=counts.__getitem__)]  # max keeps the first maximal key in insertion order


def prompt_stats(scores: Sequence[float], preds: Sequence[Any] | None = None) -> dict[str, float]:
    """The statistics of one prompt's ``n`` scores (``preds``: each sample's answer, or :data:`NO_PRED`); empty
    for ``n`` = 1. ``maj@k`` only when every sample has a pred (verl: ``"pred"`` in the reward's extra info)."""
    vals = np.asarray(scores, dtype=np.float64)
    n = len(vals)
    if n <= 1:
        return {}
    has_pred = preds is not None and all(p is not NO_PRED for p in preds)
    out = {f"mean@{n}": float(np.mean(vals)), f"std@{n}": float(np.std(vals))}
    for k in bootstrap_sizes(n):
        idx = _bootstrap_indices(n, k)
        sample = vals[idx]
        best, worst = sample.max(axis=1), sample.min(axis=1)
        out |= {f"best@{k}/mean": float(np.mean(best)), f"best@{k}/std": float(np.std(best)),
                f"worst@{k}/mean": float(np.mean(worst)), f"worst@{k}/std": float(np.std(worst))}
        if has_pred:
            assert preds is not None
            maj = np.array([majority_value(vals[row].tolist(), [preds[i] for i in row]) for row in idx])
            out |= {f"maj@{k}/mean": float(np.mean(maj)), f"maj@{k}/std": float(np.std(maj))}
    return out


def source_stats(per_prompt: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each statistic averaged over the prompts that have it (verl averages over uids with ``np.mean``)."""
    sums: dict[str, list[float]] = {}
    for stats in per_prompt:
        for name, value in stats.items():
            sums.setdefault(name, []).append(value)
    return {name: float(np.mean(v)) for name, v in sums.items()}


def validation_metrics(data_sources: Sequence[str], uids: Sequence[Hashable], scores: Sequence[float],
                       preds: Sequence[Any] | None = None) -> dict[str, dict[str, float]]:
    """``{data_source: {stat: value}}`` over samples given one per entry (verl's ``process_validation_metrics``
    for the ``reward`` variable)."""
    groups: dict[str, dict[Hashable, list[int]]] = {}
    for i, (src, uid) in enumerate(zip(data_sources, uids, strict=True)):
        groups.setdefault(src, {}).setdefault(uid, []).append(i)
    out = {}
    for src, by_uid in groups.items():
        out[src] = source_stats([prompt_stats([scores[i] for i in rows],
                                              [preds[i] for i in rows] if preds is not None else None)
                                 for rows in by_uid.values()])
    return out


def accumulate(rows: Sequence[list[float]], scores: Sequence[float], preds: Sequence[Any], n: int,
               stats: Sequence[str], *, offset: int = 0) -> None:
    """Add each prompt's ``n`` scores (prompt-major, ``rows[i]``: the sums of prompt ``i``'s data source, shared by
    its prompts) from ``offset`` on: the score sum, the sample count, then each of ``stats``' sum and count over
    prompts (:func:`prompt_stats`; ``maj@k`` only where the scorer returned preds)."""
    for i, row in enumerate(rows):
        mine = scores[i * n : (i + 1) * n]
        row[offset] += sum(mine)
        row[offset + 1] += n
        got = prompt_stats(mine, preds[i * n : (i + 1) * n])
        for j, name in enumerate(stats):
            if name in got:
                row[offset + 2 + 2 * j] += got[name]
                row[offset + 3 + 2 * j] += 1


def source_metrics(prefix: str, sources: Sequence[str], totals: Sequence[Sequence[float]],
                   stats: Sequence[str]) -> dict[str, float]:
    """``<prefix><source>`` (the mean score) and ``<prefix><source>/<stat>`` (the statistics, averaged over the
    prompts that have them) from :func:`accumulate`'s sums, reduced over ranks."""
    metrics = {f"{prefix}{src}": t[0] / max(t[1], 1) for src, t in zip(sources, totals)}
    for src, t in zip(sources, totals):
        for j, name in enumerate(stats):
            if t[3 + 2 * j] > 0:  # maj@k only where the reward function reports a pred (as verl)
                metrics[f"{prefix}{src}/{name}"] = t[2 + 2 * j] / t[3 + 2 * j]
    return metrics

