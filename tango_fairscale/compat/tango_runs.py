"""Tango 1.3.2's run records with the time the command started (guarded; applied with the other
Tango fixes).

Tango registers a run after it has built the step graph, and a step such as ``task_scores``
receives its model already built, so the time spent loading models (33 s of a 48 s ``mc_suite``
run) falls before the run's registration and outside every step's times. A local workspace's
run directory also gets ``started.json``: ``{"process_start": <ISO time>}``, when the process
running ``tango run`` started (Linux: from ``/proc``; elsewhere: when this package was imported).
``tango-fairscale results`` measures a run's wall time from it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import Any

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
