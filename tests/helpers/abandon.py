"""A final checkpoint that supersedes a background write in flight, on every rank of a spawned
process group: each rank writes step 3's checkpoint, starts step 5's with slow file writes, then
saves the final step 10's with ``supersede``; rank 0 records how long that final save took."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from helpers.ranks import in_group, run_on_ranks

#: Written by rank 0 into the plan's work directory: the final save's seconds.
SECONDS = "final-save-seconds.txt"


def supersede_on_ranks(plan: Any, slow_write_s: float) -> float:
    """Run :func:`_worker` on every rank of ``plan``'s job; the final save's seconds (rank 0)."""
    run_on_ranks(plan, _worker, slow_write_s)
    return float((plan.config.work_dir / SECONDS).read_text())


def _worker(rank: int, plan: Any, slow_write_s: float) -> None:
    import threading

    from tango_fairscale.records.manifest import HashingFile
    from tango_fairscale.runtime.process_group import barrier
    from tango_fairscale.train.checkpoints import BackgroundWriter, CheckpointPolicy
    from tango_fairscale.train.loop import build_engine

    with in_group(plan, rank, timeout_s=120):
        engine = build_engine(plan)
        policy = CheckpointPolicy(Path(plan.config.work_dir) / "checkpoints", "run-1")
        writer = BackgroundWriter(engine, policy, 120)
        writer.save(3, wait=True)
        write, writing = HashingFile.write, threading.Event()

        def slow_write(self: Any, data: Any) -> int:
            if "partial-step0000005" in self._file.name:
                writing.set()
                time.sleep(slow_write_s)
            return write(self, data)

        HashingFile.write = slow_write  # type: ignore[method-assign]
        writer.save(5)
        assert writing.wait(60)
        barrier()  # every rank's step-5 write is under way
        started = time.perf_counter()
        writer.save(10, model_only=True, supersede=True, wait=True)
        if rank == 0:
            seconds = time.perf_counter() - started
            (Path(plan.config.work_dir) / SECONDS).write_text(f"{seconds}\n")
        del engine, writer  # freed while the group lives (helpers/ranks.py)
