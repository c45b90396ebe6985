"""Preemption: USR2 (Slurm's ``--signal`` before the time limit) and TERM set a flag; the ranks agree on
it at the next step boundary (one all-reduce), checkpoint together and exit with the requeue code.

A signal handler must not run collectives or I/O: it only records the signal.
"""

from __future__ import annotations

import signal
import threading


class PreemptionFlag:
    def __init__(self, signals: tuple[int, ...] = (signal.SIGUSR2, signal.SIGTERM)):
        self._event = threading.Event()
        self.received: int | None = None
        self._previous = {}
        for sig in signals:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. under a test harness): nothing to install
                pass

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        self.received = signum
        self._event.set()

    @property
    def local(self) -> bool:
        return self._event.is_set()

    def restore(self) -> None:
        """Put the previous handlers back (once: the components and the entry point both call it)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
