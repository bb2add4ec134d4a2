"""``compat/transformers.py``: within :func:`unpacked_sequences` transformers never looks for
packed sequences (no host read), and its own detection is back afterwards, even after an error."""

from __future__ import annotations

import pytest
import torch
from transformers import masking_utils

from tango_fairscale.compat.transformers import unpacked_sequences


def test_packed_sequences_are_not_looked_for_within_the_block() -> None:
    detect = masking_utils.find_packed_sequence_indices
    packed = torch.tensor([[0, 1, 2, 0, 1]])  # two sequences in one row
    assert detect(packed) is not None
    with unpacked_sequences():
        assert masking_utils.find_packed_sequence_indices(packed) is None
    assert masking_utils.find_packed_sequence_indices is detect
    with pytest.raises(RuntimeError), unpacked_sequences():
        raise RuntimeError("a failed forward")
    assert masking_utils.find_packed_sequence_indices is detect
