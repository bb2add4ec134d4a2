"""The training step's hashed settings checked before any process starts (``train/settings.py``):
one line per bad value, a batch that does not split over the devices, a training task with a
chat template, and validation tasks that generate under an engine that cannot."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from evaluation.test_generation_refusals import task as generation_task
from tango.common import Lazy, Params
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import TrainingEngine

from tango_fairscale.evaluation.call import GenerationSettings
from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks
from tango_fairscale.train.plan import TrainRuntime
from tango_fairscale.train.settings import (
    TrainComponents,
    TrainSettings,
    refuse_generation,
    training_data,
)

VALID: dict[str, Any] = {
    "train_steps": 10,
    "batch_size": 8,
    "grad_accum": 1,
    "seed": 1,
    "validate_every": None,
    "max_gen_toks": 256,
    "generation_seed": 1234,
}


def settings(**overrides: Any) -> TrainSettings:
    """Valid settings but for ``overrides`` (every ``TrainSettings`` of this file is made here,
    from the step's arguments of the same names)."""
    fields = {**VALID, **overrides}
    generation = GenerationSettings(fields.pop("max_gen_toks"), fields.pop("generation_seed"))
    return TrainSettings(**fields, generation=generation)


def refusal(**overrides: Any) -> str:
    with pytest.raises(ConfigurationError) as error:
        settings(**overrides)
    assert "\n" not in str(error.value)
    return str(error.value)


def engine(name: str) -> Lazy[TrainingEngine]:
    return Lazy(TrainingEngine, Params({"type": name}))


@pytest.mark.parametrize("name", ["train_steps", "batch_size", "grad_accum"])
@pytest.mark.parametrize("value", [0, -2, 1.5, True])
def test_counts_must_be_positive_integers(name: str, value: Any) -> None:
    assert refusal(**{name: value}) == f"{name} must be a positive integer, got {value!r}"


def test_the_defaults_and_nulls_are_accepted() -> None:
    made = settings(validate_every=None)
    assert (made.generation.max_gen_toks, made.generation.seed) == (256, 1234)
    settings(validate_every=3, seed=-1)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"validate_every": 0}, "validate_every must be a positive integer or null, got 0"),
        ({"seed": "42"}, "seed must be an integer, got '42'"),
        ({"max_gen_toks": 0}, "max_gen_toks must be a positive integer, got 0"),
        ({"generation_seed": "7"}, "generation_seed must be an integer, got '7'"),
    ],
)
def test_bad_values_are_refused_in_one_line(overrides: dict, message: str) -> None:
    assert refusal(**overrides).startswith(message)


def test_a_batch_that_does_not_split_over_devices_and_micro_batches_is_refused(
    tmp_path: Path,
) -> None:
    step = SimpleNamespace(unique_id="s", work_dir=tmp_path, name="s", workspace=None)
    parts = TrainComponents(None, engine("tango_fairscale::ddp"), [], None)  # type: ignore[arg-type]
    made = settings(batch_size=6, grad_accum=2)
    with pytest.raises(ConfigurationError, match="batch_size 6 must be divisible by device_count"):
        made.plan(step, TrainRuntime(device_count=2), parts, [("q", "a")] * 12, [])  # type: ignore[arg-type]
    made = settings(batch_size=8)
    with pytest.raises(ConfigurationError, match="only 4 training examples for batch_size 8"):
        made.plan(step, TrainRuntime(), parts, [("q", "a")] * 4, [])  # type: ignore[arg-type]


def test_only_an_engine_that_cannot_generate_refuses_generating_tasks(
    tmp_path: Path, piqa_small: Any
) -> None:
    generating = load_tasks(generation_task(tmp_path))
    with pytest.raises(ConfigurationError) as error:
        refuse_generation(engine("tango_fairscale::pipe"), generating)
    assert str(error.value).startswith("validation task 'tiny_generation': the pipe engine")
    refuse_generation(engine("tango_fairscale::ddp"), generating)
    refuse_generation(engine("no_such::engine"), generating)  # refused where it is built
    scoring = load_tasks(TaskSpec(name="piqa", dataset=piqa_small))
    refuse_generation(engine("tango_fairscale::pipe"), scoring)


def test_training_data_is_the_tasks_pairs_validated_on_the_task_by_default(
    tmp_path: Path, piqa_small: Any
) -> None:
    task = TaskSpec(name="piqa", dataset=piqa_small)
    pairs, validation = training_data(task, None, engine("tango_fairscale::ddp"))
    assert len(pairs) == len(piqa_small["train"]) and validation == [task]
    assert all(isinstance(c, str) and isinstance(a, str) for c, a in pairs)
    other = generation_task(tmp_path)
    assert training_data(task, [other], engine("tango_fairscale::ddp"))[1] == [other]
    with pytest.raises(ConfigurationError, match="'tiny_generation': the pipe engine"):
        training_data(task, [other], engine("tango_fairscale::pipe"))


@pytest.mark.parametrize(
    "formatting", [{"apply_chat_template": True}, {"system_instruction": "Be brief."}]
)
def test_a_training_task_with_a_chat_template_or_instruction_is_refused(
    formatting: dict, piqa_small: Any
) -> None:
    task = TaskSpec(name="piqa", dataset=piqa_small, **formatting)
    with pytest.raises(ConfigurationError, match="set apply_chat_template / system_instruction"):
        training_data(task, None, engine("tango_fairscale::ddp"))
