"""The FairScale engine reproduces DDP: per-step losses and final weights, 2 CPU processes, fp32."""

import pytest
import torch
from conftest import assert_same_training, train_in, train_tiny
from tango.common.exceptions import ConfigurationError

from tango_fairscale.model import ModelWrapper


@pytest.mark.parametrize(
    "sharding",
    [
        {},  # per-block units, flat parameters
        {"flatten_parameters": False},
        {"activation_checkpointing": True, "cpu_offload": True},
    ],
    ids=["per-block", "unflattened", "checkpointing+offload"],
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
