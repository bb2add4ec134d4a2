"""A suite of lm-eval tasks validated in the training loop by 2 CPU processes (fairscale, fsdp2) —
every rank scoring a slice through the engine — equals the single-process ``task_scores`` of the
trained model: the same metrics and standard errors for every task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, engine_config
from tango.common import Lazy, Params
from tango.integrations.torch import Model, TrainingEngine
from tango.workspaces import LocalWorkspace

from tango_fairscale.evaluation.harness import merge, summary
from tango_fairscale.evaluation.steps import TaskScoresStep
from tango_fairscale.tasks.lm_eval import TaskSpec
from tango_fairscale.train.step import TrainStep

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "tasks"
SUITE = ["piqa", "arc_easy", "hellaswag", "winogrande", "openbookqa", "sciq", "boolq", "copa",
         "mmlu_anatomy"]  # fmt: skip


def suite(num_fewshot: int = 0) -> list[TaskSpec]:
    return [
        TaskSpec(name=task, data_dir=str(FIXTURES / task), num_fewshot=num_fewshot, limit=12)
        for task in SUITE
    ]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["fairscale", "fsdp2"])
def test_in_loop_suite_equals_single_process_scores(
    engine: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    step = TrainStep(
        model=Lazy(
            Model, Params({"type": "tango_fairscale::causal_lm", "model": str(tiny_model_dir)})
        ),
        engine=Lazy(TrainingEngine, Params(engine_config(f"tango_fairscale::{engine}"))),
        task=TaskSpec(name="piqa", data_dir=str(FIXTURES / "piqa")),
        validate_tasks=suite(num_fewshot=2),
        train_steps=1,
        batch_size=8,
        device_count=2,
        pack_sequences=True,
    )
    trained = step.result(LocalWorkspace(tmp_path))
    logged = {
        k[len("val_") :]: v
        for r in trained.training_log
        for k, v in r.items()
        if k.startswith("val_")
    }
    results = [TaskScoresStep().run(model=trained, task=spec, batch_size=8) for spec in suite(2)]
    expected = summary(merge(results))
    assert {key for key in logged if "/" in key} == {key for key in expected if "/" in key}
    for key, value in expected.items():
        if "/" in key:
            assert logged[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert all(logged[f"{task}/num_examples"] == 12 for task in SUITE)


def test_the_suite_loads(tiny_model_dir: Any) -> None:
    """The suite's task specs load (the slow test above scores them)."""
    from tango_fairscale.tasks.lm_eval import load_tasks

    for spec in suite():
        assert list(load_tasks(spec)["tasks"]) == [spec.name]
