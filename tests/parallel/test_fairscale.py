"""The FairScale engine reproduces DDP: per-step losses and final weights, 2 CPU processes, fp32."""

import pytest
import torch
from conftest import assert_same_training, train_in, train_tiny
from tango.common.exceptions import ConfigurationError

from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.parallel.fairscale import check_checkpointed_units
from tango_fairscale.parallel.sharding import ShardingConfig, selected_units


@pytest.mark.parametrize(
    "sharding",
    [
        {},  # per-block units, flat parameters
        {"flatten_parameters": False},
        {"activation_checkpointing": True, "cpu_offload": True},
        {"activation_checkpointing": [r"model\.transformer\.h\.0"]},  # some of the units
    ],
    ids=["per-block", "unflattened", "checkpointing+offload", "checkpointing-one-unit"],
)
def test_fairscale_matches_ddp(
    sharding, ddp_reference, tmp_path, tiny_model_dir, piqa_small
) -> None:
    trained = train_tiny(
        tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fairscale", 2, sharding=sharding
    )
    assert_same_training(ddp_reference, trained.training_log, trained.state_dict())
    # The comparison can fail: the untrained model is far from the reference.
    untrained = ModelWrapper(str(tiny_model_dir))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(
            untrained.state_dict(), ddp_reference.state_dict(), atol=1e-5, rtol=0
        )


def test_compiled_checkpointed_units_match_ddp(
    ddp_reference, tmp_path, tiny_model_dir, piqa_small
) -> None:
    """``compile: true`` (torch.compile per block, inside checkpointing and FairScale's wrapper)
    changes speed, not results."""
    sharding = {"compile": True, "activation_checkpointing": True}
    trained = train_tiny(
        tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fairscale", 2, sharding=sharding
    )
    assert_same_training(ddp_reference, trained.training_log, trained.state_dict())


def test_one_process_matches_two(ddp_reference, tmp_path, tiny_model_dir, piqa_small) -> None:
    """The global batch does not depend on the world size, so neither does the trajectory."""
    trained = train_tiny(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fairscale", 1)
    assert_same_training(ddp_reference, trained.training_log, trained.state_dict())


def test_resuming_on_another_device_count_is_refused(tmp_path, tiny_model_dir, piqa_small) -> None:
    """FairScale's per-rank shards cannot be resharded: a one-line error says what to do."""
    train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fairscale", 2, 5)
    with pytest.raises(ConfigurationError) as error:
        train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fairscale", 1, 10)
    message = str(error.value)
    assert "cannot reshard" in message and "device_count=2" in message and "\n" not in message


@pytest.mark.parametrize(
    "sharding",
    [
        {"activation_checkpointing": [r"model\.transformer\.h\.[0-9]+\.attn"]},
        {"modules_to_wrap": [], "activation_checkpointing": [r"model\.transformer\.h\.[0-9]+"]},
    ],
    ids=["inside-units", "inside-the-root"],
)
def test_checkpointing_part_of_a_unit_is_refused(sharding, tiny_model_dir) -> None:
    """FairScale frees a unit's parameters when a checkpointed part of it ends its backward
    (the run crashed at world size 2, and at 1 with mixed precision)."""
    model = ModelWrapper(str(tiny_model_dir))
    units, checkpointed = selected_units(model, ShardingConfig(**sharding))
    with pytest.raises(ConfigurationError) as error:
        check_checkpointed_units(units, checkpointed)
    message = str(error.value)
    assert "checkpoints whole sharding units only" in message and "\n" not in message
    assert "'model.transformer.h.0" in message and "use the fsdp2 engine" in message


def test_checkpointing_part_of_a_unit_fails_before_training(
    tmp_path, tiny_model_dir, piqa_small
) -> None:
    sharding = {"activation_checkpointing": [r"model\.transformer\.h\.[0-9]+\.attn"]}
    with pytest.raises(ConfigurationError, match="checkpoints whole sharding units only"):
        train_tiny(
            tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fairscale", 1, sharding=sharding
        )
