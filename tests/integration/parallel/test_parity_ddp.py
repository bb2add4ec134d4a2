"""The DDP engine's own option: ``compile`` changes speed, not results (one compiled process
against the 2-process DDP parity run, ``tests/helpers/parity.py``)."""

import pytest
from conftest import assert_same_run
from helpers.parity import DDP, RunSpec, define, trains

COMPILED = define("ddp/compile-one-process", RunSpec("ddp", 1, engine_params={"compile": True}))


@pytest.mark.slow
@trains(COMPILED, DDP)
def test_compiled_blocks_match_eager(trained_run) -> None:
    assert_same_run(trained_run(DDP), trained_run(COMPILED))
