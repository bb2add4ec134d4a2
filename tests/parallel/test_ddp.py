"""The DDP engine's own option: ``compile`` changes speed, not results."""

import pytest
from conftest import assert_same_training, train_tiny


def test_compiled_blocks_match_eager(ddp_reference, tmp_path, tiny_model_dir, piqa_small) -> None:
    trained = train_tiny(
        tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::ddp", 1, compile=True
    )
    assert_same_training(ddp_reference, trained.training_log, trained.state_dict())


def test_compile_must_be_a_boolean(tmp_path, tiny_model_dir, piqa_small) -> None:
    """Tango checks the field's type while building the engine, before any training."""
    with pytest.raises(TypeError, match="Expected compile to be bool, found yes"):
        train_tiny(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::ddp", 1, compile="yes")
