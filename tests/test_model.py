"""The model wrapper's fast paths compute what Hugging Face's model computes.

* the vocabulary projection padded to ``VOCAB_ALIGNMENT`` columns (zero weights, ``-inf`` bias)
  gives the same logits, cross-entropy and gradients as the plain ``nn.Linear`` head;
* GPT-2's ``gelu_new`` runs as one fused ``nn.GELU(approximate="tanh")`` and the wrapped model's
  hidden states match the unmodified Hugging Face model's.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from transformers.activations import NewGELUActivation

from tango_fairscale.model import VOCAB_ALIGNMENT, ModelWrapper, _aligned_projection


def test_aligned_projection_equals_the_plain_head() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 100, bias=False)
    hidden = torch.randn(7, 16)
    targets = torch.randint(0, 100, (7,))
    padded = _aligned_projection(head)(hidden)
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
    torch.testing.assert_close(_aligned_projection(biased)(hidden)[:, :100], biased(hidden))
    aligned = torch.nn.Linear(16, 128, bias=False)
    assert _aligned_projection(aligned) is aligned


def test_gelu_is_fused_and_the_model_computes_the_same(tiny_model_dir: Path) -> None:
    wrapper = ModelWrapper(model=str(tiny_model_dir))
    reference = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    assert not any(isinstance(m, NewGELUActivation) for m in wrapper.model.modules())
    assert any(isinstance(m, NewGELUActivation) for m in reference.modules())
    ids = torch.randint(0, 50257, (3, 20))
    with torch.no_grad():
        ours = wrapper.model(ids).logits
        theirs = reference(ids).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
