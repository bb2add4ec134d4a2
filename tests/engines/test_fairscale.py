"""The FairScale engine reproduces DDP: per-step losses and final weights, 2 CPU processes, fp32."""

from pathlib import Path

import pytest
import torch
from conftest import train_tiny

from tango_fairscale.model import ModelWrapper


def assert_same_training(reference: ModelWrapper, candidate: ModelWrapper) -> None:
    losses = [r["train_loss"] for r in reference.training_log if "train_loss" in r]
    other = [r["train_loss"] for r in candidate.training_log if "train_loss" in r]
    assert len(losses) == len(other) == 20
    for step, (a, b) in enumerate(zip(losses, other), start=1):
        assert b == pytest.approx(a, rel=1e-5), f"loss differs at step {step}"
    expected, actual = reference.state_dict(), candidate.state_dict()
    assert expected.keys() == actual.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=1e-5, msg=key)
    accuracies = [r["val_acc"] for r in candidate.training_log if "val_acc" in r]
    assert accuracies == [r["val_acc"] for r in reference.training_log if "val_acc" in r]


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory, tiny_model_dir: Path, piqa_small) -> ModelWrapper:
    workspace = tmp_path_factory.mktemp("ws")
    return train_tiny(workspace, tiny_model_dir, piqa_small, device_count=2)


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
    assert_same_training(ddp_reference, trained)
    # The comparison can fail: the untrained model is far from the reference.
    untrained = ModelWrapper(str(tiny_model_dir))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(
            untrained.state_dict(), ddp_reference.state_dict(), atol=1e-5, rtol=0
        )


def test_one_process_matches_two(ddp_reference, tmp_path, tiny_model_dir, piqa_small) -> None:
    """The global batch does not depend on the world size, so neither does the trajectory."""
    trained = train_tiny(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fairscale", 1)
    assert_same_training(ddp_reference, trained)
