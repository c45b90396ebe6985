"""The names of the metrics the trainer logs: plain strings, no numpy or h5py, so the config compiler can check a
watchdog rule's metric on a login node without loading the HDF5 stack. ``hpcppo.metrics.schema`` re-exports them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

#: Columns every trainer declares; a trainer may add its own (e.g. ``val/score/<data_source>``).
STANDARD_COLUMNS: tuple[str, ...] = (
    # reward and score of the rollout batch
    "reward/mean",
    "reward/std",
    "reward/max",
    "reward/min",
    "score/mean",
    "score/std",
    # KL between actor and reference, and the KL controller
    "kl/actor_ref",
    "kl/coef",
    "kl/reward_penalty",  # the KL in the reward this step (verl's actor/reward_kl_penalty); feeds the controller
    # policy update
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
    # value update
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/vf_explained_var",
    "critic/values_mean",
    "critic/grad_norm",
    "critic/lr",
    # advantages and returns
    "advantages/mean",
    "advantages/std",
    "returns/mean",
    # responses
    "response/length_mean",
    "response/length_max",
    "response/clip_ratio",
    "prompt/length_mean",
    # throughput
    "perf/tokens_per_s",
    "perf/step_time_s",
    "perf/max_memory_gb",
    # time of each phase
    "time/generate_s",
    "time/reward_s",
    "time/old_logprob_s",
    "time/ref_s",
    "time/values_s",
    "time/adv_s",
    "time/actor_update_s",
    "time/critic_update_s",
    "time/weight_sync_s",
    "time/checkpoint_s",  # the checkpoint written after the previous row (rows go out before checkpoints)
    # |engine logprob - trainer logprob|, mean over response tokens: a rollout/trainer mismatch detector
    "rollout/logprob_gap",
    # validation (mean over all validation data sources)
    "val/score",
)

#: Columns a trainer adds when its configuration produces them (the KL loss only with actor.use_kl_loss).
OPTIONAL_COLUMNS: tuple[str, ...] = ("actor/kl_loss",)
#: Per-data-source validation scores: ``val/score/<data_source>``.
VALIDATION_PREFIX = "val/score/"


def trainer_columns(val_sources: Sequence[str] = ()) -> list[str]:
    """Every column the trainer declares for a run with these validation data sources."""
    return [*STANDARD_COLUMNS, *OPTIONAL_COLUMNS, *(VALIDATION_PREFIX + s for s in val_sources)]


def is_trainer_column(name: str) -> bool:
    """Whether the trainer can log ``name`` (a rule watching anything else would never fire)."""
    return name in STANDARD_COLUMNS or name in OPTIONAL_COLUMNS or (
        name.startswith(VALIDATION_PREFIX) and len(name) > len(VALIDATION_PREFIX))


class Headline(NamedTuple):
    """One headline metric: what a person looks at first."""

    name: str
    better: str | None  # "max" or "min": the direction in which a value is better; None: no "best"
    views: frozenset[str]  # where it is shown (see VIEWS)


#: Where headline metrics are shown: the trainer's log line, ``hpcppo metrics summary``, ``hpcppo compare``,
#: ``hpcppo follow``, ``hpcppo plot`` without ``-m``, and the few lines printed when a job waited for ends.
VIEWS: tuple[str, ...] = ("log", "summary", "compare", "follow", "plot", "end")


def _h(name: str, better: str | None, views: str) -> Headline:
    return Headline(name, better, frozenset(views.split()))


#: The headline metrics, in display order: every view lists its own in this order.
HEADLINE: tuple[Headline, ...] = (
    _h("reward/mean", "max", "log summary compare follow plot end"),
    _h("score/mean", "max", "log summary compare end"),
    _h("val/score", "max", "log summary compare"),
    _h("kl/actor_ref", None, "log summary compare follow plot end"),
    _h("kl/coef", None, "summary compare follow plot end"),
    _h("response/length_mean", None, "end"),
    _h("actor/pg_loss", None, "log summary"),
    _h("actor/kl_loss", None, "summary"),
    _h("critic/vf_loss", None, "log summary"),
    _h("actor/pg_clipfrac", None, "summary"),
    _h("critic/vf_clipfrac", None, "summary"),
    _h("critic/vf_explained_var", "max", "summary compare"),
    _h("actor/entropy", None, "summary"),
    _h("actor/grad_norm", None, "summary"),
    _h("critic/grad_norm", None, "summary"),
    _h("perf/tokens_per_s", "max", "summary compare follow"),
    _h("perf/step_time_s", "min", "log summary compare"),
)


def headline(view: str) -> tuple[Headline, ...]:
    """The headline metrics shown in ``view`` (one of :data:`VIEWS`), in display order."""
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r}; views: {', '.join(VIEWS)}")
    return tuple(h for h in HEADLINE if view in h.views)


def headline_names(view: str) -> tuple[str, ...]:
    return tuple(h.name for h in headline(view))
