"""transformers 5 without a host wait per forward.

Without an attention mask, transformers 5 looks for packed sequences in every forward
(``masking_utils.find_packed_sequence_indices``: ``(mask[:, -1] == 0).all()`` read on the host),
which makes the CPU wait for the GPU once per forward and leaves the GPU idle while Python
launches the rest of it. :class:`~tango_fairscale.model.causal_lm.ModelWrapper` calls the model
without a mask only for right-padded batches (one sequence per row, positions from 0; packed
batches come with their own mask), so :func:`unpacked_sequences` answers "not packed" without
looking, for the duration of that call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def unpacked_sequences() -> Iterator[None]:
    """Within the block, transformers treats every row as one sequence."""
    from transformers import masking_utils

    detect = getattr(masking_utils, "find_packed_sequence_indices", None)
    if detect is None:  # another transformers: nothing to skip
        yield
        return
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = detect
