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

#: With [rollout.multi_turn] enable (declared then only): the tool loop's metrics of a step
#: (hpcppo.rollout.tool_loop), over all ranks; with :func:`tool_columns`.
TOOL_LOOP_COLUMNS: tuple[str, ...] = (
    "rollout/turns_mean",  # assistant turns per trajectory
    "rollout/turns_max",
    "rollout/tool_calls_mean",  # calls run per trajectory
    "rollout/tool_errors",  # error observations: calls that could not run, tools that failed
    "rollout/tool_timeouts",  # calls whose tool worker did not answer in call_timeout_s
    "time/tool_s",  # the slowest rank's time in tool calls (part of time/generate_s)
)



def validation_tool_name(name: str) -> str:
    """A tool-loop metric's validation twin: ``rollout/x`` -> ``val/x``, ``time/tool_s`` -> ``val/tool_s``."""
    return "val/tool_s" if name == "time/tool_s" else "val/" + name.split("/", 1)[1]


#: The same counts over a validation's trajectories (a multi-turn run that validates); with
#: :func:`validation_tool_columns`.
VALIDATION_TOOL_COLUMNS: tuple[str, ...] = tuple(validation_tool_name(c) for c in TOOL_LOOP_COLUMNS)

#: Columns a trainer adds when its configuration produces them (the KL loss only with actor.use_kl_loss).
OPTIONAL_COLUMNS: tuple[str, ...] = (
    "actor/kl_loss",
    # [reward_model]: its scores over the batch and the share of re-templated inputs cut to its max_length
    "reward_model/score_mean",
    "reward_model/score_max",
    "reward_model/score_min",
    "reward_model/truncated_frac",
    # [reward_manager] dapo with overlong_buffer.log: verl's overlong_reward and overlong extra info, over the batch
    "reward_manager/overlong_reward_mean",
    "reward_manager/overlong_frac",
    # rollout.placement = "split" (issue 35): how old the trained samples were, in policy versions (weight
    # broadcasts), batches dropped for exceeding rollout.max_staleness, the trainer's wait for samples and the
    # rollout ranks' wait for work, and the weight broadcast's rate
    "rollout/staleness_mean",
    "rollout/staleness_max",
    "rollout/dropped_stale",
    "time/trainer_idle_s",
    "time/rollout_idle_s",
    "perf/weight_broadcast_gbps",
)
#: Per-tool counts of the tool loop: ``rollout/tool_calls/<tool>`` and ``rollout/tool_failures/<tool>``.
TOOL_PREFIXES: tuple[str, ...] = ("rollout/tool_calls/", "rollout/tool_failures/")
#: Their validation twins: ``val/tool_calls/<tool>`` and ``val/tool_failures/<tool>``.
VALIDATION_TOOL_PREFIXES: tuple[str, ...] = tuple(validation_tool_name(p) for p in TOOL_PREFIXES)


def tool_columns(tools: Sequence[str]) -> list[str]:
    """The per-tool columns of a run with these tools (by schema name)."""
    return [p + t for t in tools for p in TOOL_PREFIXES]


def validation_tool_columns(tools: Sequence[str]) -> list[str]:
    """A validating multi-turn run's validation tool columns with these tools."""
    return [*VALIDATION_TOOL_COLUMNS, *(p + t for t in tools for p in VALIDATION_TOOL_PREFIXES)]


def tool_columns_in(columns: Sequence[str]) -> list[str]:
    """The tool metrics among ``columns``: :data:`TOOL_LOOP_COLUMNS` in their order, then the per-tool ones sorted
    (``hpcppo metrics summary`` shows those a run logged)."""
    fixed = [c for c in TOOL_LOOP_COLUMNS if c in columns]
    return fixed + sorted(c for c in columns if c.startswith(TOOL_PREFIXES) and c not in TOOL_LOOP_COLUMNS)


#: Per-data-source validation scores: ``val/score/<data_source>``; with ``rollout.val_n`` > 1 also
#: ``val/score/<data_source>/<stat>`` for each of :func:`validation_stats` (verl's metric names).
VALIDATION_PREFIX = "val/score/"
#: With DAPO's overlong buffer (``[reward_manager] name = "dapo"``), the same per-data-source columns of the score
#: before the penalty: ``val/acc/<data_source>[/<stat>]``, verl's ``acc`` (its ``val-core`` variable then, while
#: ``val/score`` is its ``reward``, in ``val-aux``: ``_val_metrics_update`` in verl/trainer/ppo/ray_trainer.py).
VALIDATION_ACC_PREFIX = "val/acc/"


def bootstrap_sizes(n: int) -> list[int]:
    """The subset sizes ``k`` of the ``best@k``/``worst@k``/``maj@k`` statistics for ``n`` responses per prompt:
    2, 4, 8, ... below ``n``, then ``n`` itself; none for ``n`` = 1 (verl b178a3c,
    ``verl/trainer/ppo/metric_utils.py``, ``process_validation_metrics.gen_ns``)."""
    if n <= 1:
        return []
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return [*sizes, n]


def validation_stats(n: int) -> list[str]:
    """verl's names of the validation statistics of one variable at ``n`` responses per prompt, in verl's order:
    ``mean@n``, ``std@n``, then ``best@k/mean``, ``best@k/std``, ``worst@k/mean``, ``worst@k/std``, ``maj@k/mean``,
    ``maj@k/std`` for each of :func:`bootstrap_sizes` (``maj`` only where the reward function returns a ``pred``).
    None for ``n`` = 1: the plain ``val/score/<data_source>`` is the mean."""
    if n <= 1:
        return []
    stats = [f"mean@{n}", f"std@{n}"]
    for k in bootstrap_sizes(n):
        stats += [f"best@{k}/mean", f"best@{k}/std", f"worst@{k}/mean", f"worst@{k}/std", f"maj@{k}/mean",
                  f"maj@{k}/std"]
    return stats


def validation_columns(val_sources: Sequence[str] = (), val_n: int = 1, *, acc: bool = False) -> list[str]:
    """The per-data-source validation columns: ``val/score/<source>`` and, for ``val_n`` > 1, its statistics; with
    ``acc`` (DAPO's overlong buffer) the same under ``val/acc/``."""
    prefixes = (VALIDATION_PREFIX, VALIDATION_ACC_PREFIX) if acc else (VALIDATION_PREFIX,)
    return [c for p in prefixes for s in val_sources
            for c in (p + s, *(f"{p}{s}/{st}" for st in validation_stats(val_n)))]


def trainer_columns(val_sources: Sequence[str] = (), val_n: int = 1, *, acc: bool = False) -> list[str]:
    """Every column the trainer declares for a run with these validation data sources and responses per prompt
    (``acc``: with DAPO's overlong buffer, :data:`VALIDATION_ACC_PREFIX`'s too)."""
    return [*STANDARD_COLUMNS, *OPTIONAL_COLUMNS, *validation_columns(val_sources, val_n, acc=acc)]


def is_trainer_column(name: str) -> bool:
    """Whether the trainer can log ``name`` (a rule watching anything else would never fire)."""
    return name in STANDARD_COLUMNS or name in OPTIONAL_COLUMNS or name in TOOL_LOOP_COLUMNS \
        or name in VALIDATION_TOOL_COLUMNS or any(name.startswith(p) and len(name) > len(p) for p in (
            VALIDATION_PREFIX, VALIDATION_ACC_PREFIX, *TOOL_PREFIXES, *VALIDATION_TOOL_PREFIXES))


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
    # multi-turn runs only (the columns exist there): the tool loop's turns, calls and errors
    _h("rollout/turns_mean", None, "summary"),
    _h("rollout/tool_calls_mean", None, "summary compare"),
    _h("rollout/tool_errors", "min", "summary"),
    _h("rollout/tool_timeouts", "min", "summary"),
)


def headline(view: str) -> tuple[Headline, ...]:
    """The headline metrics shown in ``view`` (one of :data:`VIEWS`), in display order."""
    if view not in VIEWS:
        raise ValueError(f"unknown view {view!r}; views: {', '.join(VIEWS)}")
    return tuple(h for h in HEADLINE if view in h.views)


def headline_names(view: str) -> tuple[str, ...]:
    return tuple(h.name for h in headline(view))
