"""Advantage estimators by name, and what each needs: the torch-free half of :mod:`hpcppo.algos.registry`.

The config compiler runs on login nodes without torch; it validates ``algorithm.adv_estimator`` against the names
declared here and takes from them whether a run trains a critic (``needs_values``) and compares several responses
per prompt (``needs_index``). :mod:`hpcppo.algos.registry` attaches the tensor function to each name; registering a
new estimator there (``@register_advantage_estimator("name", needs_values=...)``) declares it here too, so a spec
can select it without any change to the config.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EstimatorNeeds", "ESTIMATORS", "declare", "lookup", "names", "needs_critic", "needs_greedy_baseline",
           "needs_groups"]


@dataclass(frozen=True)
class EstimatorNeeds:
    """What an estimator needs besides rewards and the response mask."""

    name: str
    needs_values: bool = False
    """Critic values at rollout time: the run builds and trains a critic."""
    needs_index: bool = False
    """Group ids (responses to the same prompt): the run needs ``rollout.n >= 2``."""
    needs_baseline: bool = False
    """The score of a greedy response to each prompt (ReMax): the trainer decodes one per prompt every step."""
    needs_sum_pi_squared: bool = False
    """The actor's ``sum_v pi_v^2`` per token (verl's ``actor.calculate_sum_pi_squared``) and the old log-probs:
    the optimal token baselines. The trainer's old-log-prob pass computes it only for these estimators
    (``hpcppo.models.compute_log_prob_outputs``); the config refuses them with rollout correction's bypass mode,
    which skips that pass."""


ESTIMATORS: dict[str, EstimatorNeeds] = {}
"""Every declared estimator, in declaration order."""


def declare(name: str, *, needs_values: bool = False, needs_index: bool = False,
            needs_baseline: bool = False, needs_sum_pi_squared: bool = False) -> EstimatorNeeds:
    """Declare estimator ``name``. Declaring it again with the same needs changes nothing; with other needs it is
    a ``ValueError`` (two estimators would share a name)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"advantage estimator names are identifiers, got {name!r}")
    needs = EstimatorNeeds(name, needs_values=needs_values, needs_index=needs_index, needs_baseline=needs_baseline,
                           needs_sum_pi_squared=needs_sum_pi_squared)
    known = ESTIMATORS.setdefault(name, needs)
    if known != needs:
        raise ValueError(f"advantage estimator {name!r} is already declared as {known}")
    return known


def lookup(name: str) -> EstimatorNeeds:
    """The needs of ``name``; ``ValueError`` listing the known names when it is not declared."""
    needs = ESTIMATORS.get(name)
    if needs is None:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {', '.join(sorted(ESTIMATORS))}")
    return needs


def names() -> tuple[str, ...]:
    """The declared names, in declaration order (the built-ins first)."""
    return tuple(ESTIMATORS)


def needs_critic(name: str) -> bool:
    """Whether estimator ``name`` needs critic values (so the trainer must build and train a critic)."""
    return lookup(name).needs_values


def needs_greedy_baseline(name: str) -> bool:
    """Whether estimator ``name`` needs the score of a greedy response to each prompt (ReMax's baseline)."""
    return lookup(name).needs_baseline


def needs_groups(name: str) -> bool:
    """Whether estimator ``name`` compares the responses to one prompt (so it needs several per prompt)."""
    return lookup(name).needs_index


declare("gae", needs_values=True)
declare("grpo", needs_index=True)
declare("rloo", needs_index=True)
declare("reinforce_plus_plus")
declare("reinforce_plus_plus_baseline", needs_index=True)
declare("remax", needs_baseline=True)
declare("gpg", needs_index=True)
# verl b178a3c's registry (verl/trainer/ppo/core_algos.py): hpcppo.algos.baselines
declare("opo", needs_index=True)
declare("grpo_passk", needs_index=True)
declare("optimal_token_baseline", needs_index=True, needs_sum_pi_squared=True)
declare("tir_optimal_token_baseline", needs_index=True, needs_sum_pi_squared=True)
