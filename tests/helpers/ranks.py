"""A function run on every rank of a ``TrainPlan``'s job, in spawned processes that join the
job's process group (``helpers/rank_eval.py``, ``helpers/abandon.py``): the spawning and the
joining written once, and the two-process CPU job's plan those tests give them."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any


def two_rank_plan(
    name: str, work_dir: Path, model_dir: Path, engine_fields: dict, runtime: Any = None
) -> Any:
    """The ``TrainPlan`` of a two-process CPU job (gloo, seed 42) whose ``engine_fields`` engine
    holds the ``tango_fairscale::causal_lm`` model of ``model_dir``: no training pairs or tasks,
    batches of 8, ``runtime`` (a ``TrainRuntime``; its defaults when ``None``)."""
    from tango.common import Lazy, Params
    from tango.integrations.torch import Model, TrainConfig, TrainingEngine

    from tango_fairscale.train.launch import component_modules
    from tango_fairscale.train.loop import TrainPlan, TrainRuntime

    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)}))
    engine = Lazy(TrainingEngine, Params(engine_fields))
    config = TrainConfig(
        name, work_dir, is_distributed=True, devices=[-1, -1], world_size=2, seed=42
    )
    return TrainPlan(
        config, model, engine, [], [], 8, runtime or TrainRuntime(),
        component_modules=component_modules(model, engine),
    )  # fmt: skip


def run_on_ranks(plan: Any, worker: Callable[..., None], *args: Any) -> None:
    """``worker(rank, plan, *args)`` on every rank of ``plan``'s job (a store of its own, the
    workers forked from a server that imported the plan's components)."""
    from tango_fairscale.runtime.process_group import hosted_store
    from tango_fairscale.runtime.spawn import run_workers

    config = plan.config
    config.work_dir.mkdir(parents=True, exist_ok=True)
    config.distributed_port = 0
    with hosted_store(config):
        run_workers(
            worker,
            (plan, *args),
            config.world_size,
            signal.SIGTERM,
            preload=("tango_fairscale.train.loop", *plan.component_modules),
        )


@contextlib.contextmanager
def in_group(plan: Any, rank: int, timeout_s: float = 300) -> Iterator[None]:
    """Rank ``rank`` of ``plan``'s job joined to its process group while the block runs (free
    engines inside it: a DDP reducer freed after the group is destroyed was seen to hang in
    gloo's destructor)."""
    from tango_fairscale.runtime.process_group import (
        join_process_group,
        leave_process_group,
        spawned_store,
    )

    config = plan.config
    config.worker_id = rank
    timeout = timedelta(seconds=timeout_s)
    join_process_group(config, timeout, spawned_store(config, timeout))
    try:
        yield
    finally:
        leave_process_group()
