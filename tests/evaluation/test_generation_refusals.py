"""Generation the package does not do is refused in one line before any work: a task that runs
the generated code, an unknown ``gen_kwargs`` key, beam search, sampling at temperature 0,
``max_gen_toks`` beyond the model's window, the pipe engine, a model whose generation config
changes greedy decoding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tango.common import Lazy, Params
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model, TrainingEngine

from tango_fairscale.evaluation import generation
from tango_fairscale.evaluation.steps import TaskScoresStep
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.tasks.lm_eval import TaskSpec
from tango_fairscale.train.step import TrainStep


def one_line(error: BaseException, *fragments: str) -> None:
    message = str(error)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


@pytest.fixture(scope="module")
def short_model(tokenizer_dir: Path) -> ModelWrapper:
    """A randomly initialised 1-layer GPT-2 with a 32-token window."""
    from helpers.tokenizer import vocabulary_fields

    config = {"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 32}
    config.update(vocabulary_fields(tokenizer_dir))
    return ModelWrapper(config=config, tokenizer=str(tokenizer_dir), seed=0)


@pytest.fixture
def no_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any generation fails the test: a refusal must come first."""

    def fail(*_: Any, **__: Any) -> None:
        raise AssertionError("generation started before the refusal")

    monkeypatch.setattr(generation, "decode_batch", fail)


def task(tmp_path: Path, **overrides: Any) -> TaskSpec:
    """A small ``generate_until`` task over two local documents."""
    data = tmp_path / "questions.jsonl"
    data.write_text('{"q": "one", "a": "1"}\n{"q": "two", "a": "2"}\n')
    config = {
        "task": "tiny_generation",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "Q: {{q}}\nA:",
        "doc_to_target": "{{a}}",
        "generation_kwargs": {"until": ["\n"], "do_sample": False, "max_gen_toks": 4},
        "metric_list": [{"metric": "exact_match"}],
        **overrides,
    }
    return TaskSpec(config=config)


def score(model: ModelWrapper, spec: TaskSpec, **arguments: Any) -> dict:
    return TaskScoresStep(step_name="refusals").run(model=model, task=spec, **arguments)


@pytest.mark.parametrize(
    "gen_kwargs, message",
    [
        ({"until": ["\n"], "beam_width": 3}, "unknown gen_kwargs key 'beam_width'"),
        ({"until": ["\n"], "max_gen_tokens": 3}, "did you mean 'max_gen_toks'?"),
        ({"until": ["\n"], "num_beams": 4}, "num_beams 4: the package decodes greedily"),
        ({"do_sample": True, "temperature": 0.0}, "sampling needs a temperature above 0"),
        ({"do_sample": True}, "sampling needs a temperature above 0"),
        ({"until": 5}, "until must be a text or a list, got 5"),
    ],
)
def test_bad_gen_kwargs_are_refused_when_the_task_loads(
    short_model: ModelWrapper, tmp_path: Path, no_generation: None, gen_kwargs: dict, message: str
) -> None:
    with pytest.raises(ConfigurationError) as error:
        score(short_model, task(tmp_path, generation_kwargs=gen_kwargs))
    one_line(error.value, "task 'tiny_generation'", message)


def test_a_task_that_runs_generated_code_is_refused(
    short_model: ModelWrapper, tmp_path: Path, no_generation: None
) -> None:
    with pytest.raises(ConfigurationError) as error:
        score(short_model, task(tmp_path, unsafe_code=True))
    one_line(error.value, "runs the generated code (unsafe_code)", "choose another task")


def test_lm_evals_humaneval_is_refused_by_name(
    short_model: ModelWrapper, no_generation: None
) -> None:
    with pytest.raises(ConfigurationError) as error:
        score(short_model, TaskSpec(name="humaneval"))
    one_line(error.value, "task 'humaneval' runs the generated code (unsafe_code)")


@pytest.mark.parametrize(
    "overrides, arguments",
    [
        ({}, {"max_gen_toks": 32}),  # the step's default for tasks that set none
        ({"generation_kwargs": {"until": ["\n"], "max_gen_toks": 40}}, {}),
    ],
)
def test_max_gen_toks_beyond_the_window_is_refused(
    short_model: ModelWrapper, tmp_path: Path, no_generation: None, overrides: dict, arguments: dict
) -> None:
    spec = task(tmp_path, **overrides)
    if not overrides:
        spec.config["generation_kwargs"] = {"until": ["\n"]}  # type: ignore[index]
    with pytest.raises(ConfigurationError) as error:
        score(short_model, spec, **arguments)
    one_line(error.value, "is not below the model's window of 32 tokens", "lower max_gen_toks")


def test_a_generation_config_with_a_repetition_penalty_is_refused(
    short_model: ModelWrapper, tmp_path: Path, no_generation: None
) -> None:
    short_model.model.generation_config.repetition_penalty = 1.3
    try:
        with pytest.raises(ConfigurationError) as error:
            score(short_model, task(tmp_path))
    finally:
        short_model.model.generation_config.repetition_penalty = 1.0
    one_line(error.value, "generation_config sets repetition_penalty=1.3", "set it to 1.0")


def test_the_pipe_engine_refuses_generation_before_training(tmp_path: Path) -> None:
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": "never-loaded"}))
    engine = Lazy(TrainingEngine, Params({"type": "tango_fairscale::pipe"}))
    piqa = TaskSpec(name="piqa", data_dir=str(Path(__file__).parents[1] / "fixtures/tasks/piqa"))
    with pytest.raises(ConfigurationError) as error:
        TrainStep(step_name="refusals").run(
            model=model,
            engine=engine,
            task=piqa,
            validate_tasks=[task(tmp_path)],
            train_steps=1,
            batch_size=8,
        )
    one_line(error.value, "validation task 'tiny_generation'", "the pipe engine does not generate")


def test_a_chat_template_the_tokenizer_lacks_is_refused(
    short_model: ModelWrapper, tmp_path: Path, no_generation: None
) -> None:
    spec = task(tmp_path)
    spec.apply_chat_template = True
    with pytest.raises(ConfigurationError) as error:
        score(short_model, spec)
    one_line(error.value, "asks for apply_chat_template", "has no chat template")


def test_the_training_task_takes_no_chat_template(tmp_path: Path) -> None:
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": "never-loaded"}))
    engine = Lazy(TrainingEngine, Params({"type": "tango_fairscale::ddp"}))
    piqa = Path(__file__).parents[1] / "fixtures/tasks/piqa"
    with pytest.raises(ConfigurationError) as error:
        TrainStep(step_name="refusals").run(
            model=model,
            engine=engine,
            task=TaskSpec(name="piqa", data_dir=str(piqa), apply_chat_template=True),
            train_steps=1,
            batch_size=8,
        )
    one_line(error.value, "set apply_chat_template / system_instruction on validate_tasks only")
