"""Stop signals (``runtime/signals.py``): recorded instead of killing the process, a second Ctrl-C
stops at once, the previous handlers come back, and a launcher passes them on to its workers."""

from __future__ import annotations

import logging
import signal
import threading

import pytest

from tango_fairscale.runtime.signals import (
    INTERRUPT_HINT,
    Preemption,
    forwarded_to,
    stop_signals,
)


def test_a_run_stops_on_its_preemption_signal_and_ctrl_c() -> None:
    assert stop_signals(signal.SIGTERM) == (signal.SIGTERM, signal.SIGINT)
    assert stop_signals(signal.SIGUSR1) == (signal.SIGUSR1, signal.SIGINT)
    assert stop_signals(signal.SIGINT) == (signal.SIGINT,)


def test_the_preemption_signal_is_recorded_and_the_handlers_restored() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGINT)}
    preemption = Preemption(signal.SIGUSR1)
    try:
        assert not preemption.received
        signal.raise_signal(signal.SIGUSR1)  # would end the process without the handler
        assert preemption.received and preemption.signal == signal.SIGUSR1
    finally:
        preemption.restore()
    assert {s: signal.getsignal(s) for s in before} == before
    preemption.restore()  # a second restore changes nothing
    assert {s: signal.getsignal(s) for s in before} == before


def test_ctrl_c_is_recorded_once_then_stops_at_once(caplog: pytest.LogCaptureFixture) -> None:
    preemption = Preemption(signal.SIGTERM)
    try:
        with caplog.at_level(logging.WARNING, logger="tango_fairscale.runtime.signals"):
            signal.raise_signal(signal.SIGINT)
        assert preemption.received and preemption.signal == signal.SIGINT
        assert INTERRUPT_HINT in caplog.messages
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        preemption.restore()


def test_the_preemption_signal_twice_is_still_only_recorded() -> None:
    preemption = Preemption(signal.SIGUSR2)
    try:
        signal.raise_signal(signal.SIGUSR2)
        signal.raise_signal(signal.SIGUSR2)
        assert preemption.received and preemption.signal == signal.SIGUSR2
    finally:
        preemption.restore()


def test_off_the_main_thread_no_handler_is_set() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    made: list[Preemption] = []
    thread = threading.Thread(target=lambda: made.append(Preemption(signal.SIGUSR1)))
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGUSR1) is before
    made[0].restore()
    assert signal.getsignal(signal.SIGUSR1) is before and not made[0].received


def test_forwarded_signals_go_to_the_current_pids_and_the_handlers_come_back() -> None:
    asked: list[int] = []

    def pids() -> list[int]:  # a worker that already exited: its kill is ignored
        asked.append(1)
        return [2**22 + 1]

    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGINT)}
    with forwarded_to((signal.SIGUSR1, signal.SIGINT), pids):
        assert signal.getsignal(signal.SIGUSR1) is not before[signal.SIGUSR1]
        signal.raise_signal(signal.SIGUSR1)
        assert len(asked) == 1  # the workers are asked for at each signal
        signal.raise_signal(signal.SIGINT)
        assert len(asked) == 2
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C stops the launcher itself
            signal.raise_signal(signal.SIGINT)
        assert len(asked) == 2
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_child_forked_while_recording_dies_on_the_signal() -> None:
    """lm-eval's bootstrap pool forks during a validation: its workers must still die on the
    ``SIGTERM`` their pool's ``terminate`` sends (they inherit the recording handler)."""
    import multiprocessing
    import os
    import time

    preemption = Preemption(signal.SIGTERM)
    try:
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
        child.start()
        time.sleep(0.2)
        os.kill(child.pid, signal.SIGTERM)  # type: ignore[arg-type]
        child.join(20)
        assert child.exitcode == -signal.SIGTERM, child.exitcode
        assert not preemption.received  # this process recorded nothing
    finally:
        preemption.restore()
        if child.is_alive():
            child.kill()
