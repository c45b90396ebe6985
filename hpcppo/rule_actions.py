"""The watchdog rules' actions: one table of what each is called, which one wins, how it is recorded and what it does.

==================  ==========  ==================  ================================================================
action              precedence  transition          what happens (:mod:`hpcppo.watchdog.respond` carries it out)
==================  ==========  ==================  ================================================================
``pause``           0           ``stop``            the run checkpoints and stops, exit 76: waits for ``hpcppo resume``
``requeue``         1           ``stop``            the run checkpoints and stops, exit 75: requeued
``rollback``        2           ``roll_back``       back to the newest committed checkpoint from before the anomaly
``restart_critic``  3           ``restart_critic``  the critic's weights and optimizer from that checkpoint
``raise_kl_coef``   4           ``raise_kl_coef``   KL coefficient x ``factor``, clamped to ``[min_value, max_value]``
``set_grad_clip``   5           ``set_grad_clip``   the tighter clip applies from the next update
==================  ==========  ==================  ================================================================

Each is recorded as the event ``watchdog.<action>`` (:attr:`RuleAction.event_kind`). The table is read by the config
(a rule's ``action``, the conditions it takes), :mod:`hpcppo.watchdog.decide` (precedence, the actions that stop the
run, the rule's parameters an action carries), :mod:`hpcppo.rundir.events` (the event kinds) and
:mod:`hpcppo.watchdog.respond` (one function per transition). It imports nothing of hpcppo, so all of them may import
it. A new action is a row here and, when its transition is new, that transition's function in ``respond``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ACTIONS", "EVENT_PREFIX", "NAMES", "PRECEDENCE", "STOPS", "TRANSITIONS", "RuleAction", "lookup"]

EVENT_PREFIX = "watchdog."  # + an action's name: the kind of the event it is recorded as

#: What :mod:`hpcppo.watchdog.respond` does for an action: checkpoint and stop (the only action applied on its
#: step); reload the actor and the critic from a checkpoint; reload the critic only; raise the state's KL
#: coefficient; tighten the gradient clip (already in the decision's state).
TRANSITIONS: tuple[str, ...] = ("stop", "roll_back", "restart_critic", "raise_kl_coef", "set_grad_clip")


@dataclass(frozen=True)
class RuleAction:
    """One action of the watchdog's rules."""

    name: str
    precedence: int
    """0 wins over 1 ...: when several rules match on one step (see :mod:`hpcppo.watchdog.decide`)."""
    transition: str
    """One of :data:`TRANSITIONS`."""
    params: tuple[str, ...] = ()
    """The rule's fields the action carries (``Rule`` and ``Action`` fields of the same names)."""
    conditions: tuple[str, ...] | None = None
    """The rule conditions that make sense for the action; None: any."""

    @property
    def event_kind(self) -> str:
        """The kind of the event the action is recorded as."""
        return f"{EVENT_PREFIX}{self.name}"


#: The actions in the order the config lists them (its help and its error messages).
ACTIONS: tuple[RuleAction, ...] = (
    # Raising the KL penalty only makes sense when KL is too high (the field guide's rule is backwards).
    RuleAction("raise_kl_coef", 4, "raise_kl_coef", ("factor", "min_value", "max_value"), conditions=("gt",)),
    RuleAction("rollback", 2, "roll_back", ("lr_scale",)),
    RuleAction("pause", 0, "stop"),
    RuleAction("set_grad_clip", 5, "set_grad_clip", ("grad_clip",), conditions=("gt", "nonfinite")),
    RuleAction("restart_critic", 3, "restart_critic"),
    RuleAction("requeue", 1, "stop"),
)

NAMES: tuple[str, ...] = tuple(a.name for a in ACTIONS)
#: The names, highest precedence first.
PRECEDENCE: tuple[str, ...] = tuple(a.name for a in sorted(ACTIONS, key=lambda a: a.precedence))
#: The actions that stop the run, highest precedence first.
STOPS: tuple[str, ...] = tuple(n for n in PRECEDENCE if next(a for a in ACTIONS if a.name == n).transition == "stop")

_BY_NAME = {a.name: a for a in ACTIONS}


def lookup(name: str) -> RuleAction:
    """The action ``name``; ``ValueError`` listing the known ones."""
    action = _BY_NAME.get(name)
    if action is None:
        raise ValueError(f"unknown watchdog action {name!r}; known: {', '.join(NAMES)}")
    return action
