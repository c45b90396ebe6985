"""The watchdog: pure rule decisions taken by the trainer at every step boundary (:mod:`.decide`).

Importing this package loads only :mod:`.decide` (no torch, numpy, h5py or pandas): the login-node CLI
and the process beside the trainer import it. ``replay`` lives in :mod:`hpcppo.watchdog.replay`.
"""

from __future__ import annotations

from hpcppo.watchdog.decide import (PRECEDENCE, Action, Decision, WatchdogState, decide, raised_kl_coef,
                                    rollback_target, unknown_metrics)

__all__ = ["PRECEDENCE", "Action", "Decision", "WatchdogState", "decide", "raised_kl_coef", "rollback_target",
           "unknown_metrics"]
