"""Float8 training on every rank of a spawned CPU process group (float8 emulated: the GPU check
taken away in each worker): each rank builds the plan's engine, trains two steps and reports
what its wrapped model holds."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from helpers.ranks import in_group, run_on_ranks

#: Written by each rank into the plan's work directory.
REPORT = "float8-rank{rank}.json"


def train_on_ranks(plan: Any) -> list[dict[str, Any]]:
    """Each rank's report: its float8 layers, its two losses, the full state's keys (rank 0)."""
    run_on_ranks(plan, _worker)
    world = plan.config.world_size
    work_dir = Path(plan.config.work_dir)
    return [json.loads((work_dir / REPORT.format(rank=r)).read_text()) for r in range(world)]


def _worker(rank: int, plan: Any) -> None:
    import torch

    import tango_fairscale.parallel.engine as engine_module
    from tango_fairscale.parallel.float8 import Float8Conv1D, apply_float8
    from tango_fairscale.train.loop import build_engine

    engine_module.check_float8 = lambda *args: None  # type: ignore[assignment]
    engine_module.apply_float8 = functools.partial(apply_float8, emulate=True)
    with in_group(plan, rank, timeout_s=120):
        engine = build_engine(plan)
        layers = sum(isinstance(m, Float8Conv1D) for m in engine.model.modules())
        ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(rank))
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
        losses = []
        for _ in range(2):
            loss, _ = engine.forward_train(batch, 0, 1)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        state = engine.full_model_state()
        report = {"layers": layers, "losses": losses, "keys": sorted(state) if state else None}
        (Path(plan.config.work_dir) / REPORT.format(rank=rank)).write_text(json.dumps(report))
        del engine  # freed while the group lives (helpers/ranks.py)
