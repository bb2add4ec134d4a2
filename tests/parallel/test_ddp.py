"""The DDP engine's own option: ``compile`` is a boolean. That it changes speed, not results, is
``tests/integration/parallel/test_parity_ddp.py``."""

import pytest
from conftest import train_tiny


def test_compile_must_be_a_boolean(tmp_path, tiny_model_dir, piqa_small) -> None:
    """Tango checks the field's type while building the engine, before any training."""
    with pytest.raises(TypeError, match="Expected compile to be bool, found yes"):
        train_tiny(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::ddp", 1, compile="yes")
