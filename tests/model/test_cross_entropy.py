"""A chunk's cross-entropy and gradient: the compiled loss's out-of-place form gives the eager
in-place form's bits, and both the reference values."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tango_fairscale.model.cross_entropy import chunk_cross_entropy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("scale", "softcap"), [(1.0, None), (0.5, None), (1.0, 3.0)])
def test_the_out_of_place_form_gives_the_in_place_forms_bits(
    dtype: torch.dtype, scale: float, softcap: float | None
) -> None:
    generator = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(7, 33, generator=generator)).to(dtype)
    targets = torch.randint(0, 33, (7,), generator=generator)
    weights = torch.rand(7, generator=generator)
    arguments = (targets, weights, torch.bfloat16, True, scale, softcap)

    in_place = chunk_cross_entropy(logits.clone(), *arguments)
    out_of_place = chunk_cross_entropy(logits.clone(), *arguments, out_of_place=True)

    for ours, theirs in zip(out_of_place, in_place, strict=True):
        assert ours is not None and theirs is not None
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)


def test_the_gradient_is_the_weighted_cross_entropys() -> None:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 11, generator=generator, requires_grad=True)
    targets = torch.randint(0, 11, (5,), generator=generator)
    weights = torch.rand(5, generator=generator)

    nll, grad, grad_bias = chunk_cross_entropy(
        logits.detach().clone(), targets, weights, torch.float32, True, out_of_place=True
    )

    reference = F.cross_entropy(logits, targets, reduction="none")
    (reference * weights).sum().backward()
    torch.testing.assert_close(nll, reference.detach())
    torch.testing.assert_close(grad, logits.grad)
    assert grad_bias is not None
    torch.testing.assert_close(grad_bias, logits.grad.sum(0))
