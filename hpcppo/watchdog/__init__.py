"""The watchdog, in one package: what the rules decide, what each action does to a run, and the process beside it.

- :mod:`.decide`: the pure rules (conditions, cooldown, max_count, precedence) on a run's metric rows. The rules'
  schema, the ``[watchdog]`` section, is :mod:`hpcppo.config.watchdog` (every section's schema lives in ``config``).
- :mod:`.state`: :class:`TrainingState`, a run's progress as one frozen value.
- :mod:`.respond`: how each action is carried out (pure transitions of the state, and :class:`Hands`, what the
  trainer lends the watchdog to touch models); the trainer calls :func:`respond` at every step boundary.
- :mod:`.audit`: the events it leaves in the HDF5 log and ``events.jsonl``.
- :mod:`.replay`: the same rules over a finished log (``hpcppo watchdog replay``).
- :mod:`.monitor`: the process beside the trainer (hangs, dead trainers, requeue).

Importing this package loads no torch, numpy, h5py or pandas: the login-node CLI and the monitor import it.
"""

from __future__ import annotations

from hpcppo.watchdog.decide import PRECEDENCE, Action, Decision, WatchdogState, decide, rollback_target, unknown_metrics
from hpcppo.watchdog.respond import Hands, Outcome, describe, raised_kl_coef, respond
from hpcppo.watchdog.state import TrainingState, history_keep

__all__ = ["PRECEDENCE", "Action", "Decision", "Hands", "Outcome", "TrainingState", "WatchdogState", "decide",
           "describe", "history_keep", "raised_kl_coef", "respond", "rollback_target", "unknown_metrics"]
