"""One process per device on this machine: spawned, watched, stopped together."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from tango.common.aliases import EnvVarNames
from tango.common.logging import initialize_worker_logging

from .signals import forwarded_to


class WorkerFailed(RuntimeError):
    """A spawned process died or raised; the others were stopped. The message is one line."""


def run_workers(
    worker: Callable[..., None], args: tuple[Any, ...], nprocs: int, forward: signal.Signals
) -> None:
    """Run ``worker(rank, *args)`` in ``nprocs`` spawned processes until all have returned.

    The signal ``forward`` received here is passed on to every worker. A worker that dies or
    raises stops the others at once: :class:`WorkerFailed` names it and its signal, exit code or
    the last line of its error. Unless ``OMP_NUM_THREADS`` says otherwise, each worker takes its
    share of this machine's cores for torch's intra-op threads (as torchrun sets one thread), so
    that ``nprocs`` workers do not oversubscribe the cores.
    """
    import torch.multiprocessing as mp

    context = mp.start_processes(
        _entry, args=(worker, args, nprocs), nprocs=nprocs, join=False, start_method="spawn"
    )

    def alive() -> list[int]:
        return [p.pid for p in context.processes if p.is_alive() and p.pid is not None]

    try:
        with forwarded_to(forward, alive):
            while not context.join(grace_period=5):
                pass
    except mp.ProcessExitedException as error:
        raise WorkerFailed(
            f"training process {error.error_index} died "
            f"({error.signal_name or error.exit_code}); the others were stopped"
        ) from None
    except mp.ProcessRaisedException as error:
        last = [line for line in str(error).splitlines() if line.strip()][-1]
        raise WorkerFailed(f"training process {error.error_index} failed: {last}") from None


def _entry(rank: int, worker: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // nprocs))
    if os.environ.get(EnvVarNames.LOGGING_PORT.value):
        # Under `tango run`: send this worker's log records to the main process.
        initialize_worker_logging(rank)
    worker(rank, *args)
