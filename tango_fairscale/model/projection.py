"""The vocabulary projection as the GEMM wants it: its output width padded to an aligned size."""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: The vocabulary projection's output width is padded to a multiple of this: GPT-2's 50,257 rows
#: leave cuBLAS only slow unaligned GEMM kernels (measured: 3x slower on an H200).
VOCAB_ALIGNMENT = 64


def aligned_projection(
    weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A linear head's ``weight`` and ``bias`` in ``dtype``, the output padded to
    ``VOCAB_ALIGNMENT`` columns.

    The extra rows of the weight are zeros and their bias is ``-inf``, so they add nothing to any
    softmax: the cross-entropy over the padded logits equals the one over the real ones. The
    weights are cast before they are padded: the padded copy is the compute dtype's (bf16: 77 MB
    for GPT-2), never a second fp32 copy of the head (154 MB).
    """
    weight = weight.to(dtype)
    bias = None if bias is None else bias.to(dtype)
    vocab = weight.shape[0]
    extra = -vocab % VOCAB_ALIGNMENT
    if extra == 0:
        return weight, bias
    weight = F.pad(weight, (0, 0, 0, extra))
    masked = torch.zeros(vocab + extra, dtype=dtype, device=weight.device)
    masked[vocab:] = float("-inf")
    return weight, masked if bias is None else F.pad(bias, (0, extra)) + masked
