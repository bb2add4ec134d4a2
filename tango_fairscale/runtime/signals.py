"""Stop signals: the preemption signal and Ctrl-C (``SIGINT``), recorded by each training process
instead of killing it, and passed on from the launching process to its workers.

Either one makes every rank finish its step, checkpoint and stop resumably. A second Ctrl-C in the
process the user started stops it at once (the work since the last checkpoint is lost), as a
user who presses it twice expects."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

#: The signals a job may be asked to stop with (``preemption_signal`` of the train step).
PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT")

INTERRUPT_HINT = (
    "interrupted: every rank stops after this step with a checkpoint; press Ctrl-C again to "
    "stop at once (losing the steps since the last checkpoint)"
)


def stop_signals(preemption_signal: signal.Signals) -> tuple[signal.Signals, ...]:
    """The signals a run stops on with a checkpoint: its preemption signal and ``SIGINT``."""
    return tuple(dict.fromkeys((preemption_signal, signal.SIGINT)))


class Preemption:
    """Records the stop signals (:func:`stop_signals`) instead of dying on them, until
    :meth:`restore`; :attr:`signal` is the one received.

    The training loop then stops every rank at the same step, checkpoints and exits resumably.
    In the process the user started (not a spawned worker), a second ``SIGINT`` raises
    ``KeyboardInterrupt``. A process forked meanwhile (lm-eval's bootstrap pool during a
    validation) takes a stop signal as it would without these handlers: its pool's ``terminate``
    must end it.
    """

    def __init__(self, preemption_signal: signal.Signals) -> None:
        self.signal = preemption_signal
        self.received = False
        self._escalates = multiprocessing.parent_process() is None
        self._pid = os.getpid()
        self._previous: dict[signal.Signals, Any] = {}
        # Handlers can only be set from the main thread (an executor may run steps elsewhere).
        if threading.current_thread() is threading.main_thread():
            for signum in stop_signals(preemption_signal):
                self._previous[signum] = signal.signal(signum, self._record)

    def _record(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:  # a forked child: the handler it had before, then again
            signal.signal(signum, self._previous.get(signal.Signals(signum), signal.SIG_DFL))
            os.kill(os.getpid(), signum)
            return
        interrupted = signum == signal.SIGINT and self._escalates
        if interrupted and self.received:
            raise KeyboardInterrupt
        if interrupted:
            logger.warning(INTERRUPT_HINT)
        self.received = True
        self.signal = signal.Signals(signum)

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}


@contextlib.contextmanager
def forwarded_to(
    signals: tuple[signal.Signals, ...], pids: Callable[[], list[int]]
) -> Iterator[None]:
    """While the block runs, each of ``signals`` received here is sent on to each of
    ``pids()``; a second ``SIGINT`` raises ``KeyboardInterrupt`` here instead."""
    interrupted = False

    def forward(received: int, frame: Any) -> None:
        nonlocal interrupted
        if received == signal.SIGINT:
            if interrupted:
                raise KeyboardInterrupt
            interrupted = True
            logger.warning(INTERRUPT_HINT)
        for pid in pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, received)

    previous = {signum: signal.signal(signum, forward) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
