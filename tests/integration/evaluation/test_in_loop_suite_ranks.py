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
from tango_fairscale.train.plan import TrainRuntime
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
        runtime=TrainRuntime(device_count=2, pack_sequences=True),
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


# --- generation ----------------------------------------------------------------------------------

GENERATION_SUITE = ["gsm8k", "gsm8k_cot", "triviaqa", "nq_open", "drop", "coqa",
                    "bbh_cot_fewshot_word_sorting"]  # fmt: skip


def generation_suite(yaml_dir: Path) -> list[TaskSpec]:
    """lm-eval's generation tasks on the fixtures, two-shot, 5 documents each, at most 16 new
    tokens (a local YAML including lm-eval's)."""
    import sys

    sys.path.insert(0, str(FIXTURES))
    from lm_eval_fixtures import DATA_DIR, write_generation_yaml

    return [
        TaskSpec(
            yaml=str(write_generation_yaml(task, yaml_dir, 16)),
            data_dir=str(FIXTURES / DATA_DIR[task]),
            num_fewshot=2,
            limit=5,
        )
        for task in GENERATION_SUITE
    ]


@pytest.fixture(scope="module")
def peaked_gpt2(tmp_path_factory: pytest.TempPathFactory, gpt2_tokenizer_dir: Path) -> Path:
    from helpers.peaked import save_peaked_model

    return save_peaked_model(tmp_path_factory.mktemp("peaked-gpt2"), gpt2_tokenizer_dir, "gpt2")


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["fairscale", "fsdp2"])
def test_in_loop_generation_equals_single_process(
    engine: str, tmp_path: Path, peaked_gpt2: Path
) -> None:
    """The generation suite validated in the loop by 2 processes (each decoding a share of the
    prompts through the sharded model, in lockstep) gives the single-process metrics."""
    tasks = generation_suite(tmp_path / "yaml")
    model = {"type": "tango_fairscale::causal_lm", "model": str(peaked_gpt2)}
    step = TrainStep(
        model=Lazy(Model, Params(model)),
        engine=Lazy(TrainingEngine, Params(engine_config(f"tango_fairscale::{engine}"))),
        task=TaskSpec(name="piqa", data_dir=str(FIXTURES / "piqa")),
        validate_tasks=tasks,
        train_steps=1,
        batch_size=8,
        runtime=TrainRuntime(device_count=2, eval_batch_size=4),
    )
    trained = step.result(LocalWorkspace(tmp_path / "workspace"))
    logged = {
        k[len("val_") :]: v
        for r in trained.training_log
        for k, v in r.items()
        if k.startswith("val_")
    }
    results = [TaskScoresStep().run(model=trained, task=spec, batch_size=3) for spec in tasks]
    expected = summary(merge(results))
    assert {key for key in logged if "/" in key} == {key for key in expected if "/" in key}
    for key, value in expected.items():
        if "/" in key:
            assert logged[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert all(logged[f"{task}/num_examples"] == 5 for task in GENERATION_SUITE)
