"""Evaluate task specs through an engine on every rank of a spawned process group, as validation
in the training loop does, and keep what each rank saw: its answers and how often it called the
model.

:func:`evaluate_on_ranks` builds the engine of a ``TrainPlan`` on each of ``world_size`` spawned
processes (no training step), evaluates the specs with the package's evaluator over the engine's
model call, and writes each rank's results and its count of model calls into the plan's work
directory, which the parent reads back.
"""

from __future__ import annotations

import json
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any


def evaluate_on_ranks(
    plan: Any, specs: list[Any], batch_size: int, packed: bool = False
) -> list[dict[str, Any]]:
    """Each rank's ``{"results": [...], "calls": int}``, by rank (``packed``: scoring batches
    packed)."""
    from tango_fairscale.runtime.process_group import hosted_store
    from tango_fairscale.runtime.spawn import run_workers

    config = plan.config
    config.work_dir.mkdir(parents=True, exist_ok=True)
    config.distributed_port = 0
    with hosted_store(config):
        run_workers(
            _worker,
            (plan, specs, batch_size, packed),
            config.world_size,
            signal.SIGTERM,
            preload=("tango_fairscale.train.loop", *plan.component_modules),
        )
    return [
        json.loads((config.work_dir / f"rank{rank}.json").read_text())
        for rank in range(config.world_size)
    ]


def _worker(rank: int, plan: Any, specs: list[Any], batch_size: int, packed: bool) -> None:
    import torch

    from tango_fairscale.evaluation.call import EvalOptions, ModelCall
    from tango_fairscale.evaluation.evaluator import Evaluator
    from tango_fairscale.runtime.process_group import (
        join_process_group,
        leave_process_group,
        spawned_store,
    )
    from tango_fairscale.train.loop import build_engine

    config = plan.config
    config.worker_id = rank
    timeout = timedelta(seconds=300)
    join_process_group(config, timeout, spawned_store(config, timeout))
    try:
        torch.manual_seed(config.seed)
        engine = build_engine(plan)
        engine.model.eval()
        call = ModelCall.of_engine(engine)
        calls = 0

        def counted(batch: dict[str, Any], forward: Any = call.forward) -> Any:
            nonlocal calls
            calls += 1
            return forward(batch)

        call.forward = counted
        options = EvalOptions(batch_size=batch_size, packed=packed, progress=False)
        evaluator = Evaluator(call, options)
        results = [evaluator.evaluate(spec) for spec in specs]
        path = Path(config.work_dir) / f"rank{rank}.json"
        path.write_text(json.dumps({"results": results, "calls": calls}))
        # Freed while the group lives, as the training loop frees its engine: a DDP reducer
        # freed after the group is destroyed was seen to hang in gloo's destructor.
        del engine, call, evaluator, counted
    finally:
        leave_process_group()
