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
from pathlib import Path
from typing import Any

from helpers.ranks import in_group, run_on_ranks


def evaluate_on_ranks(
    plan: Any, specs: list[Any], batch_size: int, packed: bool = False
) -> list[dict[str, Any]]:
    """Each rank's ``{"results": [...], "calls": int}``, by rank (``packed``: scoring batches
    packed)."""
    run_on_ranks(plan, _worker, specs, batch_size, packed)
    return [
        json.loads((plan.config.work_dir / f"rank{rank}.json").read_text())
        for rank in range(plan.config.world_size)
    ]


def _worker(rank: int, plan: Any, specs: list[Any], batch_size: int, packed: bool) -> None:
    import torch

    from tango_fairscale.evaluation.call import EvalOptions, ModelCall
    from tango_fairscale.evaluation.evaluator import Evaluator
    from tango_fairscale.train.loop import build_engine

    with in_group(plan, rank):
        torch.manual_seed(plan.config.seed)
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
        path = Path(plan.config.work_dir) / f"rank{rank}.json"
        path.write_text(json.dumps({"results": results, "calls": calls}))
        del engine, call, evaluator, counted  # freed while the group lives (helpers/ranks.py)
