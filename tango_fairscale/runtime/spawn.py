"""One process per device on this machine: started, watched, stopped together."""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tango.common.aliases import EnvVarNames
from tango.common.logging import initialize_worker_logging

from .signals import forwarded_to, stop_signals

#: Once a worker has failed, the seconds the others get to exit on their own, then as many after
#: SIGTERM before SIGKILL. Their collectives fail without the dead peer and a kill never damages
#: a checkpoint, so there is nothing to wait for: a stuck worker is killed 2 x 2 s after the first
#: failure.
STOP_GRACE_S = 2.0


class WorkerFailed(RuntimeError):
    """A worker process died or raised; the others were stopped. The message is one line."""


def run_workers(
    worker: Callable[..., None],
    args: tuple[Any, ...],
    nprocs: int,
    forward: signal.Signals,
    preload: Sequence[str] = (),
) -> None:
    """Run ``worker(rank, *args)`` in ``nprocs`` worker processes until all have returned.

    The workers are forked from a server process (multiprocessing's ``forkserver``) that imports
    the modules ``preload`` names once, so a worker starts without importing torch, transformers
    and Tango again; the server starts on this process's first call (that call's ``preload``
    stays) and never touches a GPU. Each worker runs with this process's environment as it is at
    the call.

    The signal ``forward`` and ``SIGINT`` received here are passed on to every worker. A worker
    that dies or raises stops the others at once: :class:`WorkerFailed` names it and its signal,
    exit code or the last line of its error (the worker's traceback is its ``__cause__``'s text).
    A worker dies with this process: one left running would train on unsupervised and write
    checkpoints beside a rerun's. Each worker takes the ``OMP_NUM_THREADS`` intra-op threads or,
    unset, its share of this machine's cores (as torchrun sets one thread), so that ``nprocs``
    workers do not oversubscribe the cores.
    """
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload([*preload, worker.__module__])
    context = mp.start_processes(
        _entry,
        args=(worker, args, nprocs, dict(os.environ)),
        nprocs=nprocs,
        join=False,
        start_method="forkserver",
    )

    def alive() -> list[int]:
        return [p.pid for p in context.processes if p.is_alive() and p.pid is not None]

    exits: dict[int, int] = {}
    try:
        with forwarded_to(stop_signals(forward), alive):
            exits = exits_at_first_failure(context.processes)
            while not context.join(grace_period=STOP_GRACE_S):
                pass
    except mp.ProcessExitedException as error:
        raise WorkerFailed(_died(error.error_index, error.signal_name or error.exit_code)) from None
    except mp.ProcessRaisedException as error:
        killed = killed_worker(exits)
        if killed is not None:  # its peers' errors (a closed connection) follow from its death
            raise WorkerFailed(killed) from error
        # Chained: the worker's traceback (the error's text) stays in the run's log.
        last = [line for line in str(error).splitlines() if line.strip()][-1]
        raise WorkerFailed(f"training process {error.error_index} failed: {last}") from error


def exits_at_first_failure(processes: Sequence[Any]) -> dict[int, int]:
    """Wait until every worker has exited or one has failed; the exit codes of those that had
    exited then. Taken before torch's ``join`` stops the others (its own kills would read as
    deaths), and because ``join`` names the first failure it finds, not the first to happen: a
    worker killed mid-collective and a peer raising on the closed connection both look failed
    by the time a busy launcher looks."""
    import multiprocessing.connection

    while True:
        codes = [process.exitcode for process in processes]  # each read once: it polls
        exits = {rank: code for rank, code in enumerate(codes) if code is not None}
        if len(exits) == len(processes) or any(code != 0 for code in exits.values()):
            return exits
        running = [p.sentinel for p, code in zip(processes, codes, strict=True) if code is None]
        multiprocessing.connection.wait(running)


def killed_worker(exits: Mapping[int, int]) -> str | None:
    """The one-line failure of the first worker in ``exits`` that a signal killed, if any."""
    for rank, code in sorted(exits.items()):
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return _died(rank, name)
    return None


def _died(rank: int, cause: object) -> str:
    """:class:`WorkerFailed`'s message for a worker that exited without raising."""
    return f"training process {rank} died ({cause}); the others were stopped"


def _entry(
    rank: int,
    worker: Callable[..., None],
    args: tuple[Any, ...],
    nprocs: int,
    environ: Mapping[str, str],
) -> None:
    _die_with_the_launcher()
    _take_environment(environ)
    import torch

    threads = os.environ.get("OMP_NUM_THREADS", "")
    share = max(1, (os.cpu_count() or 1) // nprocs)
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else share)
    if os.environ.get(EnvVarNames.LOGGING_PORT.value):
        # Under `tango run`: send this worker's log records to the main process.
        initialize_worker_logging(rank)
    worker(rank, *args)


def _die_with_the_launcher() -> None:
    """SIGKILL this worker as soon as the launching process (multiprocessing's parent process, not
    the fork server) exits; a daemon thread waits for it.

    Neither the fork server nor the process group notices: the server outlives the launcher while
    its workers live, and the workers' collectives run without the launcher.
    """
    import multiprocessing

    launcher = multiprocessing.parent_process()
    assert launcher is not None and launcher.pid is not None, "not a worker process"
    launcher_pid = launcher.pid

    def wait_then_die() -> None:
        _wait_for_exit(launcher_pid)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait_then_die, name="launcher-watch", daemon=True).start()


def _wait_for_exit(pid: int) -> None:
    """Return once process ``pid`` has exited: woken by its pidfd (Linux), else polling."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfds here: poll
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(1.0)
    try:
        select.select([pidfd], [], [])
    finally:
        os.close(pidfd)


def _take_environment(environ: Mapping[str, str]) -> None:
    """Make the caller's environment of the call this worker's, also where a module the server
    preloaded read it at import: Tango's logging settings (the log socket a worker under
    ``tango run`` reports to) and Hugging Face's offline flag, parsed as those modules parse them.
    """
    import huggingface_hub.constants as hub
    import tango.common.logging as tango_logging
    from tango.common.util import _parse_bool, _parse_optional_int

    os.environ.clear()
    os.environ.update(environ)
    tango_logging.TANGO_LOG_LEVEL = environ.get(EnvVarNames.LOG_LEVEL.value)
    tango_logging.FILE_FRIENDLY_LOGGING = _parse_bool(
        environ.get(EnvVarNames.FILE_FRIENDLY_LOGGING.value, False)
    )
    tango_logging.TANGO_CLI_LOGGER_ENABLED = _parse_bool(
        environ.get(EnvVarNames.CLI_LOGGER_ENABLED.value, False)
    )
    tango_logging._LOGGING_PREFIX = environ.get(EnvVarNames.LOGGING_PREFIX.value, "")
    tango_logging._LOGGING_HOST = environ.get(EnvVarNames.LOGGING_HOST.value, "localhost")
    tango_logging._LOGGING_PORT = _parse_optional_int(environ.get(EnvVarNames.LOGGING_PORT.value))
    hub.HF_HUB_OFFLINE = hub._is_true(
        environ.get("HF_HUB_OFFLINE") or environ.get("TRANSFORMERS_OFFLINE")
    )
