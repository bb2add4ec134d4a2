"""``runtime/spawn.py``'s choice of the failure it names: a worker that a signal killed, not the
peer that raised on the connection it closed. The launch itself (fork server, signals, a dead
launcher) is ``tests/integration/runtime/test_spawned_workers.py`` and the 2-process faults of
``tests/integration/train/test_faults.py``."""

import multiprocessing
import os
import signal
import time

from tango_fairscale.runtime.spawn import exits_at_first_failure, killed_worker


def test_a_killed_worker_is_named_before_a_peer_that_raised() -> None:
    exits = {0: 1, 1: -signal.SIGKILL}
    assert killed_worker(exits) == "training process 1 died (SIGKILL); the others were stopped"
    assert killed_worker({0: 1}) is None  # raised: its own error is the one to show
    assert killed_worker({0: 0, 1: 1}) is None
    unnamed = killed_worker({1: -200})
    assert unnamed == "training process 1 died (signal 200); the others were stopped"


def _exit_at_once() -> None:
    os._exit(0)


def _die_by_sigkill() -> None:
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGKILL)


def _sleep() -> None:
    time.sleep(60)


def test_exits_are_read_when_the_first_worker_fails_not_after_the_others_are_stopped() -> None:
    """One worker done, one killed, one still running (a stuck rank): the snapshot holds the first
    two and not the third, which ``join`` would kill next."""
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=t) for t in (_exit_at_once, _die_by_sigkill, _sleep)]
    for worker in workers:
        worker.start()
    try:
        started = time.monotonic()
        exits = exits_at_first_failure(workers)
        assert time.monotonic() - started < 30
    finally:
        workers[2].kill()
        for worker in workers:
            worker.join()
    assert exits == {0: 0, 1: -signal.SIGKILL}
