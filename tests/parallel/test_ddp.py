"""The DDP engine's own option: ``compile`` changes speed, not results."""

import pytest
from conftest import assert_same_run, train_tiny
from helpers.parity import DDP, RunSpec, define, trains

COMPILED = define("ddp/compile-one-process", RunSpec("ddp", 1, engine_params={"compile": True}))


@pytest.mark.slow
@trains(COMPILED, DDP)
def test_compiled_blocks_match_eager(trained_run) -> None:
    assert_same_run(trained_run(DDP), trained_run(COMPILED))


def test_compile_must_be_a_boolean(tmp_path, tiny_model_dir, piqa_small) -> None:
    """Tango checks the field's type while building the engine, before any training."""
    with pytest.raises(TypeError, match="Expected compile to be bool, found yes"):
        train_tiny(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::ddp", 1, compile="yes")
