"""The parity harness itself: a run that fails in a group fails alone, with its error, and the
runs after it still train (in a new group)."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_a_failing_run_fails_alone(tmp_path, tiny_model_dir, piqa_small) -> None:
    from helpers.group import TrainedRun, train_many
    from helpers.parity import RunSpec, build_plan

    refused = {"sharding": {"activation_checkpointing": [r"model\.transformer\.h\.[0-9]+\.attn"]}}
    specs = {
        "first": RunSpec("ddp", 2, train_steps=2),
        "refused": RunSpec("fairscale", 2, train_steps=2, engine_params=refused),
        "last": RunSpec("ddp", 2, train_steps=2),
    }
    plans = {
        name: build_plan(spec, tmp_path / name, tiny_model_dir, piqa_small)
        for name, spec in specs.items()
    }
    for plan in plans.values():
        plan.validate_tasks = []  # training only: the failure path is what is tested
    results = train_many(plans)
    for name in ("first", "last"):
        run = results[name]
        assert isinstance(run, TrainedRun) and len(run.losses()) == 2, run
    assert results["first"].losses() == results["last"].losses()
    failure = results["refused"]
    assert isinstance(failure, str)
    assert "run 'refused' failed: training process" in failure
    assert "checkpoints whole sharding units only" in failure  # the rank's traceback
