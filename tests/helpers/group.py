"""Many training runs of one world size in one spawned process group.

A multi-process test run costs two fresh processes that import torch, transformers, Tango and
lm-eval before the first step; training a tiny model for a few steps costs far less. So
:func:`train_many` spawns ``world_size`` processes once, joins the process group once
(:func:`~tango_fairscale.runtime.process_group.join_process_group`), and trains each plan in turn
with the real loop (:func:`~tango_fairscale.train.loop.build_engine` and
:func:`~tango_fairscale.train.loop.train`), each in its own work directory. The parent reads each
run's training log and final weights back from its work directory.

A run that fails stops the group (the package's spawn stops every process when one raises, as in
a real job); its error is recorded and the runs after it train in a new group, so one failing
configuration fails one test.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

#: Written by rank 0 into a run's work directory once every rank has finished it.
DONE = "group-run.done"
#: A rank's traceback, written into the work directory of the run it failed in.
ERROR = "group-run.error-rank{rank}"


@dataclass
class TrainedRun:
    """One run's results, read from its work directory."""

    name: str
    work_dir: Path
    training_log: list[dict[str, Any]]
    state: dict[str, Any]

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def losses(self) -> list[float]:
        return [r["train_loss"] for r in self.training_log if "train_loss" in r]


class RunFailed(RuntimeError):
    """The run raised (or its group died) while training."""


def train_many(plans: dict[str, Any], timeout_s: float = 600.0) -> dict[str, TrainedRun | str]:
    """Train every ``TrainPlan`` of ``plans`` (by name; one world size, distinct work dirs) in
    one spawned group per failure-free stretch; each name's :class:`TrainedRun`, or the one-line
    error of a run that failed."""
    import signal

    from tango_fairscale.runtime.process_group import hosted_store
    from tango_fairscale.runtime.spawn import WorkerFailed, run_workers

    world_sizes = {plan.config.world_size for plan in plans.values()}
    assert len(world_sizes) == 1, f"one world size per group, got {sorted(world_sizes)}"
    [world_size] = world_sizes
    results: dict[str, TrainedRun | str] = {}
    pending = list(plans)
    while pending:
        for name in pending:
            plans[name].config.work_dir.mkdir(parents=True, exist_ok=True)
        group = [(name, plans[name]) for name in pending]
        failure = None
        try:
            if world_size == 1:
                _group_worker(0, group, timeout_s)  # here: nothing to import
            else:
                first = group[0][1].config
                first.distributed_port = 0
                with hosted_store(first):  # a new group meets in a new store
                    run_workers(
                        _group_worker,
                        (group, timeout_s),
                        world_size,
                        signal.SIGTERM,
                        preload=("tango_fairscale.train.loop", *group[0][1].component_modules),
                    )
        except WorkerFailed as error:
            failure = str(error)
        except Exception as error:  # world size 1: the run's own exception
            failure = f"{type(error).__name__}: {error}"
        finished = [name for name in pending if (plans[name].config.work_dir / DONE).exists()]
        for name in finished:
            results[name] = read_run(name, plans[name].config.work_dir)
        pending = [name for name in pending if name not in finished]
        if failure is not None:
            assert pending, f"the group failed after its last run: {failure}"
            failed = pending.pop(0)
            results[failed] = _failure(failed, plans[failed].config.work_dir, failure)
    return results


def read_run(name: str, work_dir: Path) -> TrainedRun:
    import torch

    from tango_fairscale.records.training_log import read_training_log
    from tango_fairscale.train.loop import FINAL_WEIGHTS

    state = torch.load(work_dir / FINAL_WEIGHTS, map_location="cpu", weights_only=True)
    return TrainedRun(name, work_dir, read_training_log(work_dir / "training_log.jsonl"), state)


def _failure(name: str, work_dir: Path, failure: str) -> str:
    tracebacks = sorted(work_dir.glob(ERROR.format(rank="*")))
    detail = "".join(f"\n--- {path.name}\n{path.read_text()}" for path in tracebacks)
    return f"run {name!r} failed: {failure}{detail}"


def _group_worker(rank: int, group: list[tuple[str, Any]], timeout_s: float) -> None:
    """Rank ``rank`` of the group: join the process group once, then train each plan in turn."""
    import torch
    import torch.distributed as dist

    from tango_fairscale.runtime.process_group import (
        join_process_group,
        leave_process_group,
        spawned_store,
    )
    from tango_fairscale.train.loop import build_engine, train

    first = group[0][1].config
    first.worker_id = rank
    timeout = timedelta(seconds=timeout_s)
    store = spawned_store(first, timeout) if first.world_size > 1 else None
    join_process_group(first, timeout, store)
    try:
        for _, plan in group:
            config = plan.config
            config.worker_id = rank
            torch.manual_seed(config.seed)
            engine = None
            try:
                engine = build_engine(plan)
                train(engine, plan)
            except BaseException:
                error = config.work_dir / ERROR.format(rank=rank)
                error.write_text(traceback.format_exc())
                raise
            finally:
                del engine  # its cycles wait for the collector (a full collection per run: ~0.2 s)
                torch._dynamo.reset()  # a compiled run leaves nothing to the next
            if dist.is_initialized():
                dist.barrier()
            if rank == 0:
                (config.work_dir / DONE).touch()
    finally:
        leave_process_group()
