"""Regex selection of sharding units and checkpointed modules, and its up-front errors."""

import pytest
import torch
from tango.common.exceptions import ConfigurationError

from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.parallel.precision import resolve_precision
from tango_fairscale.parallel.sharding import (
    ShardingConfig,
    check_tied_parameters,
    default_unit_patterns,
    select_modules,
    selected_units,
)


@pytest.fixture(scope="module")
def model(tiny_model_dir) -> ModelWrapper:
    return ModelWrapper(str(tiny_model_dir))


def test_default_units_are_the_transformer_blocks(model) -> None:
    units = select_modules(model, default_unit_patterns(model), "modules_to_wrap")
    assert units == ["model.transformer.h.0", "model.transformer.h.1"]


BLOCK_NAMES = ["model.transformer.h.0", "model.transformer.h.1"]


@pytest.mark.parametrize(
    ("sharding", "min_params", "units"),
    [
        ({}, "default", []),  # the tiny model's blocks are far below the threshold: one unit
        ({}, 1, BLOCK_NAMES),  # blocks at least the threshold: each its own unit
        ({"activation_checkpointing": True}, "default", BLOCK_NAMES),  # checkpointed: units
        ({"modules_to_wrap": [r"model\.transformer\.h\.0"]}, 1, ["model.transformer.h.0"]),
    ],
)
def test_the_default_units_depend_on_block_size(
    model, monkeypatch, sharding, min_params, units
) -> None:
    from tango_fairscale.parallel import sharding as module

    if min_params != "default":
        monkeypatch.setattr(module, "MIN_BLOCK_UNIT_PARAMS", min_params)
    assert selected_units(model, ShardingConfig(**sharding))[0] == units


def test_nested_matches_wrap_inner_modules_first(model) -> None:
    units = select_modules(model, [r"model\.transformer\.h\.[0-9]+(\.mlp)?"], "modules_to_wrap")
    assert units == [
        "model.transformer.h.0.mlp",
        "model.transformer.h.1.mlp",
        "model.transformer.h.0",
        "model.transformer.h.1",
    ]


def test_pattern_matching_nothing_names_close_modules(model) -> None:
    with pytest.raises(ConfigurationError) as error:
        select_modules(model, [r"inner_module\.transformer\.h\.[0-9]+"], "modules_to_wrap")
    message = str(error.value)
    assert "matches no module" in message and "model.transformer.h" in message
    assert "\n" not in message


def test_patterns_match_whole_names(model) -> None:
    with pytest.raises(ConfigurationError, match="matches no module"):
        select_modules(model, [r"transformer\.h\.0"], "modules_to_wrap")


def test_split_tied_embeddings_are_refused(model) -> None:
    check_tied_parameters(model, ["model.transformer.h.0"])  # wte and lm_head both in the root
    check_tied_parameters(model, ["model"])  # both inside one unit
    for units in (["model.transformer.wte"], ["model.transformer"]):
        with pytest.raises(ConfigurationError, match="tied parameter") as error:
            check_tied_parameters(model, units)
        assert "model.transformer.wte" in str(error.value) and "model.lm_head" in str(error.value)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"modules_to_wrap": ["model.(h"]}, "not a valid regex"),
        ({"activation_checkpointing": ["[bad"]}, "not a valid regex"),
        ({"activation_checkpointing": "yes"}, "true, false or a list"),
        ({"modules_to_wrap": [3]}, "must be strings"),
        # It checkpointed nothing (the units are the checkpointed modules, and there were none).
        ({"modules_to_wrap": [], "activation_checkpointing": True}, "modules_to_wrap, which is"),
    ],
)
def test_bad_sharding_config_is_refused_up_front(fields, message) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ShardingConfig(**fields)


@pytest.mark.parametrize(
    "name, message",
    [("fp8", "unknown precision 'fp8'"), ("16-mixed", "needs a CUDA GPU")],
)
def test_bad_precision_is_refused(name, message) -> None:
    with pytest.raises(ConfigurationError, match=message):
        resolve_precision(name, torch.device("cpu"))


def test_auto_precision_is_fp32_on_cpu() -> None:
    assert resolve_precision("auto", torch.device("cpu")).name == "32-true"
