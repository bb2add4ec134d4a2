"""The seam between evaluation and a model (``evaluation/call.py``): the options' one-line checks,
a model call through an engine (no gradients, the engine's model) or through the model itself,
and the rank agreements, which are no-ops in a process alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tango.common import Lazy, Params
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model, TrainConfig, TrainingEngine

from tango_fairscale.evaluation.call import (
    DEFAULT_SEED,
    EvalOptions,
    GenerationSettings,
    ModelCall,
    agree_max,
)
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.tasks.generation import DEFAULT_MAX_GEN_TOKS


@pytest.mark.parametrize(
    "options, message",
    [
        ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
        ({"max_batch_tokens": 0}, "max_batch_tokens must be a positive integer or null, got 0"),
        ({"max_batch_tokens": 2.5}, "max_batch_tokens must be a positive integer or null"),
    ],
)
def test_bad_eval_options_are_refused_in_one_line(options: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        EvalOptions(**options)


def test_eval_options_take_no_token_limit() -> None:
    assert EvalOptions(max_batch_tokens=None).max_batch_tokens is None


def test_generation_settings_default_to_lm_evals_and_refuse_bad_values() -> None:
    assert GenerationSettings() == GenerationSettings(DEFAULT_MAX_GEN_TOKS, DEFAULT_SEED)
    assert (DEFAULT_MAX_GEN_TOKS, DEFAULT_SEED) == (256, 1234)
    assert GenerationSettings(seed=-3).seed == -3  # any integer seeds
    with pytest.raises(ConfigurationError, match="max_gen_toks must be a positive integer"):
        GenerationSettings(max_gen_toks=0)
    for seed in (True, 1.0, "1"):
        with pytest.raises(ConfigurationError, match="generation_seed must be an integer"):
            GenerationSettings(seed=seed)  # type: ignore[arg-type]


def batch() -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.tensor([[5, 6, 7, 8], [9, 10, 11, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
        "labels": torch.tensor([[-100, -100, 7, 8], [-100, 10, 11, -100]]),
    }


@pytest.fixture
def model(tiny_model_dir: Path) -> ModelWrapper:
    return ModelWrapper(str(tiny_model_dir)).eval()


def reference(model: ModelWrapper) -> torch.Tensor:
    """The batch's log-likelihoods by the model's own forward."""
    with torch.no_grad():
        return model(**batch())["loglikelihood"]


def test_a_local_call_is_the_models_own_forward(model: ModelWrapper) -> None:
    call = ModelCall.local(model, torch.device("cpu"))
    assert call.model is model and call.generation_refusal is None
    with torch.no_grad():
        scores = call(batch())["loglikelihood"]
    assert scores.shape == (2,)
    torch.testing.assert_close(scores, reference(model), rtol=0, atol=0)


def test_an_engines_call_runs_its_model_without_gradients(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from conftest import engine_config

    config = TrainConfig("call", tmp_path, world_size=1, devices=[-1])
    lazy = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(tiny_model_dir)}))
    engine: Any = Lazy(TrainingEngine, Params(engine_config("tango_fairscale::ddp"))).construct(
        train_config=config, model=lazy
    )
    engine.model.eval()
    call = ModelCall.of_engine(engine)
    assert call.model is engine.wrapped_model and call.device == torch.device("cpu")
    assert call.generation_refusal is None  # DDP generates
    scores = call(batch())["loglikelihood"]
    assert not scores.requires_grad
    torch.testing.assert_close(scores, reference(engine.wrapped_model), rtol=0, atol=0)


def test_alone_idle_calls_nothing_and_agreement_is_ones_own(model: ModelWrapper) -> None:
    calls: list[dict] = []

    def forward(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        calls.append(batch)
        return {}

    ModelCall(forward, model, torch.device("cpu")).idle()
    assert calls == []
    assert agree_max(7, torch.device("cpu")) == 7
