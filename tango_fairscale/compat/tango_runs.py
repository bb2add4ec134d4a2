"""Tango 1.3.2's run records with the time the command started, and a finished ``tango run`` that
ends without tearing its modules down (guarded; applied with the other Tango fixes).

Tango registers a run after it has built the step graph, and a step such as ``task_scores``
receives its model already built, so the time spent loading models (33 s of a 48 s ``mc_suite``
run) falls before the run's registration and outside every step's times. A local workspace's
run directory also gets ``started.json``: ``{"process_start": <ISO time>}``, when the process
running ``tango run`` started (Linux: from ``/proc``; elsewhere: when this package was imported).
``tango-fairscale results`` measures a run's wall time from it.

Once a ``tango run`` that the user typed has finished (its steps done, its logging torn down by
Tango), Python would still free every module it imported (torch, transformers, lm-eval: 1.3-2 s
on 2 cores, measured on an evaluation-only run): the process joins its remaining threads, runs its
exit handlers, flushes its output and ends there, with status 0 (:func:`exit_now`;
:func:`patch_tango_run_exit` is applied by ``tango_fairscale/__init__.py`` to that process only,
started as ``tango`` or as ``python -m tango``:
``tango_fairscale run`` under a launcher still has its other ranks to release after Tango's
command). A failed run ends as before.
"""

from __future__ import annotations

import atexit
import datetime as dt
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

#: The file in ``runs/<name>/``.
STARTED = "started.json"

_IMPORTED = time.time()


def process_start() -> float:
    """When this process started (seconds since the epoch)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of proc(5), counted from the state (field 3)
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED


def patch_tango_run_start() -> None:
    """Make ``LocalWorkspace.register_run`` write :data:`STARTED` into the run's directory."""
    from tango.workspaces import LocalWorkspace

    original = LocalWorkspace.register_run
    if getattr(original, "records_start", False):
        return

    def register_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        run = original(self, *args, **kwargs)
        started = dt.datetime.fromtimestamp(process_start(), dt.timezone.utc)
        (self.run_dir(run.name) / STARTED).write_text(
            json.dumps({"process_start": started.isoformat()}) + "\n"
        )
        return run

    register_run.records_start = True  # type: ignore[attr-defined]
    LocalWorkspace.register_run = register_run  # type: ignore[method-assign]


def patch_tango_run_exit() -> None:
    """Make Tango's command group end the process through :func:`exit_now` once ``run`` has
    succeeded and Tango's own cleanup (its result callback) has run."""
    import click

    main = running_tango_command()
    original = main._result_callback
    if original is None or getattr(original, "exits_now", False):
        return

    def cleanup(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if click.get_current_context().invoked_subcommand == "run":
            exit_now()
        return result

    cleanup.exits_now = True  # type: ignore[attr-defined]
    main._result_callback = cleanup


def running_tango_command() -> Any:
    """Tango's command group as this process runs it. ``python -m tango`` runs Tango's
    ``__main__.py`` as the module ``__main__``: importing ``tango.__main__`` would give a second
    copy, whose command group never runs."""
    running = sys.modules.get("__main__")
    spec = getattr(running, "__spec__", None)
    if running is not None and spec is not None and spec.name == "tango.__main__":
        return running.main
    from tango.__main__ import main

    return main


def exit_now() -> NoReturn:
    """End this process with status 0 as Python's own exit would — its other threads joined
    (daemon ones excepted), its exit handlers run, its output flushed — but without freeing its
    modules one by one."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)
