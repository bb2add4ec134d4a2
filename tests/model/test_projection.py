"""The vocabulary projection padded to ``VOCAB_ALIGNMENT`` columns (zero weights, ``-inf`` bias)
gives the same logits, cross-entropy and gradients as the plain ``nn.Linear`` head."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tango_fairscale.model.projection import VOCAB_ALIGNMENT, aligned_projection


def test_aligned_projection_equals_the_plain_head() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 100, bias=False)
    hidden = torch.randn(7, 16)
    targets = torch.randint(0, 100, (7,))
    padded = F.linear(hidden, *aligned_projection(head.weight, None, torch.float32))
    assert padded.shape == (7, 128) and 128 % VOCAB_ALIGNMENT == 0
    torch.testing.assert_close(padded[:, :100], head(hidden))
    assert torch.isneginf(padded[:, 100:]).all()

    loss = F.cross_entropy(padded, targets)
    (grad,) = torch.autograd.grad(loss, head.weight)
    plain_loss = F.cross_entropy(head(hidden), targets)
    (plain_grad,) = torch.autograd.grad(plain_loss, head.weight)
    torch.testing.assert_close(loss, plain_loss)
    torch.testing.assert_close(grad, plain_grad)

    biased = torch.nn.Linear(16, 100)
    torch.testing.assert_close(
        F.linear(hidden, *aligned_projection(biased.weight, biased.bias, torch.float32))[:, :100],
        biased(hidden),
    )
    aligned = torch.nn.Linear(16, 128, bias=False)
    assert aligned_projection(aligned.weight, None, torch.float32) == (aligned.weight, None)


def test_the_head_is_cast_before_it_is_padded() -> None:
    """The padded copy is made in the compute dtype, and equals the padded fp32 head cast."""
    head = torch.nn.Linear(16, 100)
    weight, bias = aligned_projection(head.weight, head.bias, torch.bfloat16)
    assert weight.dtype == torch.bfloat16 and bias is not None and bias.dtype == torch.bfloat16
    fp32_weight, fp32_bias = aligned_projection(head.weight, head.bias, torch.float32)
    assert fp32_bias is not None
    assert torch.equal(weight, fp32_weight.to(torch.bfloat16))
    assert torch.equal(bias, fp32_bias.to(torch.bfloat16))
