"""The FairScale engine refuses checkpointing part of a sharding unit, before any training. Its
parity with DDP (every layout, compiled, one process) and its refusal to reshard a 2-process
checkpoint are ``tests/integration/parallel/test_parity_fairscale.py``."""

import pytest
from conftest import train_tiny
from tango.common.exceptions import ConfigurationError

from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.parallel.fairscale import check_checkpointed_units
from tango_fairscale.parallel.sharding import ShardingConfig, selected_units


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
