"""A chunk's cross-entropy and gradient: the compiled loss's out-of-place form gives the eager
in-place form's bits, and both the reference values; compiled (on a GPU), one graph serves every
row count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tango_fairscale.model.cross_entropy import chunk_cross_entropy, compiled_chunk_cross_entropy


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled loss runs on GPUs")
def test_the_compiled_chunk_compiles_once_for_every_row_count() -> None:
    """The rows are dynamic from the first call (a step's last chunk is shorter) and the
    vocabulary fixed; each row count gives the eager form's values."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    generator = torch.Generator().manual_seed(2)
    for rows in (64, 48, 33):
        logits = (4 * torch.randn(rows, 1000, generator=generator)).to("cuda", torch.bfloat16)
        targets = torch.randint(0, 1000, (rows,), generator=generator).cuda()
        weights = torch.rand(rows, generator=generator).cuda()
        arguments = (targets, weights, torch.bfloat16, True)

        compiled = compiled_chunk_cross_entropy()(logits.clone(), *arguments)
        eager = chunk_cross_entropy(logits.clone(), *arguments, out_of_place=True)

        for ours, theirs in zip(compiled, eager, strict=True):  # summed in another order
            assert ours is not None and theirs is not None
            torch.testing.assert_close(ours, theirs)
    assert counters["stats"]["unique_graphs"] == 1
