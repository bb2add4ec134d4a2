"""Preemption signals: recorded by each training process instead of killing it, and passed on
from the launching process to its workers."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

#: The signals a job may be asked to stop with (``preemption_signal`` of the train step).
PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT")


class Preemption:
    """Records ``signum`` instead of dying on it, until :meth:`restore`.

    The training loop then stops every rank at the same step, checkpoints and exits resumably.
    """

    def __init__(self, signum: signal.Signals) -> None:
        self.signal = signum
        self.received = False
        # Handlers can only be set from the main thread (an executor may run steps elsewhere).
        self._installed = threading.current_thread() is threading.main_thread()
        if self._installed:
            self._previous = signal.signal(signum, self._record)

    def _record(self, signum: int, frame: Any) -> None:
        self.received = True

    def restore(self) -> None:
        if self._installed:
            signal.signal(self.signal, self._previous)


@contextlib.contextmanager
def forwarded_to(signum: signal.Signals, pids: Callable[[], list[int]]) -> Iterator[None]:
    """While the block runs, ``signum`` received here is sent on to each of ``pids()``."""

    def forward(received: int, frame: Any) -> None:
        for pid in pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, received)

    previous = signal.signal(signum, forward)
    try:
        yield
    finally:
        signal.signal(signum, previous)
