"""The model wrapper's fast paths compute what Hugging Face's model computes.

* the chunked cross-entropy that computes its gradients in the forward pass equals full-logits
  cross-entropy in values and gradients (fp32; close under bf16 autocast);
* GPT-2's ``gelu_new`` runs as one fused ``nn.GELU(approximate="tanh")`` and the wrapped model's
  hidden states match the unmodified Hugging Face model's;
* a packed batch (queries end to end, shared contexts once, explicit attention masks) gives each
  query the scores and the loss gradients of its own right-padded row.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from transformers.activations import NewGELUActivation

from tango_fairscale.model import loss as model_module
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.model.loss import scored_row_nll


def test_gelu_is_fused_and_the_model_computes_the_same(tiny_model_dir: Path) -> None:
    wrapper = ModelWrapper(model=str(tiny_model_dir))
    reference = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    assert not any(isinstance(m, NewGELUActivation) for m in wrapper.model.modules())
    assert any(isinstance(m, NewGELUActivation) for m in reference.modules())
    ids = torch.randint(0, reference.config.vocab_size, (3, 20))
    with torch.no_grad():
        ours = wrapper.model(ids).logits
        theirs = reference(ids).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def _reference_row_losses(
    head: torch.nn.Linear, hidden: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every position's logits, per-token cross-entropy, averaged per row and summed per row in
    float64 (as the scorer sums them)."""
    token_nll = F.cross_entropy(
        head(hidden).flatten(0, 1), targets.flatten(), reduction="none", ignore_index=-100
    ).view(targets.shape)
    row_mean = token_nll.sum(dim=1) / (targets != -100).sum(dim=1).clamp(min=1)
    return row_mean, token_nll.double().sum(dim=1)


@pytest.mark.parametrize("bias", [False, True])
def test_scored_row_nll_equals_full_logits_cross_entropy_in_values_and_gradients(
    bias: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_module, "LOGIT_CHUNK_ROWS", 3)  # several chunks, a ragged last one
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 100, bias=bias)
    hidden = torch.randn(4, 6, 16, requires_grad=True)
    targets = torch.randint(0, 100, (4, 6))
    targets[0, :4] = -100
    targets[2] = -100  # a row with nothing to score
    targets[3, 1::2] = -100

    row_mean, row_nll, num_tokens = scored_row_nll(head, hidden, targets)
    ref_mean, ref_nll = _reference_row_losses(head, hidden, targets)
    torch.testing.assert_close(row_mean, ref_mean)
    torch.testing.assert_close(row_nll, ref_nll)
    assert row_nll.dtype == torch.float64
    assert num_tokens.tolist() == [2, 6, 0, 3]
    assert not row_nll.requires_grad

    parameters = [hidden, *head.parameters()]
    grads = torch.autograd.grad(3.0 * row_mean.mean(), parameters)
    ref_grads = torch.autograd.grad(3.0 * ref_mean.mean(), parameters)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad)


def test_scored_row_nll_refuses_a_loss_that_weighs_rows_differently() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(2, 3, 8, requires_grad=True)
    row_mean, _, _ = scored_row_nll(head, hidden, torch.randint(0, 50, (2, 3)))
    with pytest.raises(RuntimeError, match="equal gradients"):
        (row_mean * torch.tensor([1.0, 2.0])).sum().backward()


def test_scored_row_nll_under_bf16_autocast_is_close_to_fp32() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 100, bias=False)
    hidden = torch.randn(3, 5, 32, requires_grad=True)
    targets = torch.randint(0, 100, (3, 5))
    with torch.autocast("cpu", torch.bfloat16):
        row_mean, _, _ = scored_row_nll(head, hidden, targets)
    grads = torch.autograd.grad(row_mean.mean(), [hidden, head.weight])
    ref_mean, _ = _reference_row_losses(head, hidden, targets)
    ref_grads = torch.autograd.grad(ref_mean.mean(), [hidden, head.weight])
    assert row_mean.dtype == torch.float32 and grads[1].dtype == torch.float32
    torch.testing.assert_close(row_mean, ref_mean, rtol=2e-2, atol=2e-2)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, rtol=5e-2, atol=5e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled loss runs on GPUs")
@pytest.mark.parametrize("labels_device", ["cpu", "cuda"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("compiled", [True, False])
def test_scored_row_nll_on_a_gpu_equals_full_logits_cross_entropy(
    labels_device: str, bias: bool, compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU the chunk's cross-entropy and gradients run compiled from
    ``COMPILED_LOSS_MIN_ROWS`` tokens, eager below; labels may stay on the CPU."""
    monkeypatch.setattr(model_module, "LOGIT_CHUNK_ROWS", 5)  # full chunks and a ragged last one
    monkeypatch.setattr(model_module, "COMPILED_LOSS_MIN_ROWS", 1 if compiled else 10**9)
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 100, bias=bias, device="cuda")
    hidden = torch.randn(4, 6, 16, device="cuda", requires_grad=True)
    targets = torch.randint(0, 100, (4, 6))
    targets[0, :4] = -100
    targets[2] = -100
    targets[3, 1::2] = -100

    row_mean, row_nll, num_tokens = scored_row_nll(head, hidden, targets.to(labels_device))
    ref_mean, ref_nll = _reference_row_losses(head, hidden, targets.cuda())
    torch.testing.assert_close(row_mean, ref_mean)
    torch.testing.assert_close(row_nll, ref_nll)
    assert num_tokens.device.type == "cuda" and num_tokens.tolist() == [2, 6, 0, 3]
    with torch.no_grad():  # scoring: no gradients, another code path
        torch.testing.assert_close(scored_row_nll(head, hidden, targets)[1], ref_nll)

    parameters = [hidden, *head.parameters()]
    grads = torch.autograd.grad(3.0 * row_mean.mean(), parameters)
    ref_grads = torch.autograd.grad(3.0 * ref_mean.mean(), parameters)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad)

    with torch.autocast("cuda", torch.bfloat16):
        bf16_mean, _, _ = scored_row_nll(head, hidden, targets.to(labels_device))
    bf16_grads = torch.autograd.grad(3.0 * bf16_mean.mean(), parameters)
    torch.testing.assert_close(bf16_mean, ref_mean, rtol=2e-2, atol=2e-2)
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):  # fp32 logits from the GEMM
        bf16_nll = scored_row_nll(head, hidden, targets.to(labels_device))[1]
    torch.testing.assert_close(bf16_nll, ref_nll, rtol=2e-2, atol=2e-2)
    for grad, ref_grad in zip(bf16_grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, rtol=5e-2, atol=5e-3)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("max_length", [127, 12])  # 12: most queries are left-truncated
def test_packed_batches_score_and_train_as_padded_rows(
    attention: str, max_length: int, tiny_model_dir: Path, piqa_small
) -> None:
    from conftest import choice_queries, training_queries

    from tango_fairscale.data.batches import collate, packed_batch

    wrapper = ModelWrapper(str(tiny_model_dir))
    wrapper.model.config._attn_implementation = attention
    assert wrapper.supports_packing
    examples = list(piqa_small["validation"])[:24]
    choices = choice_queries(examples, wrapper.tokenizer, max_length)
    with torch.no_grad():
        padded = wrapper(**collate(choices, wrapper.pad_token_id))
        packed_choices = packed_batch(choices, wrapper.pad_token_id, 8)
        packed = wrapper(**packed_choices)
    assert (packed_choices["query_ids"] == -1).sum() > len(examples)  # contexts were shared
    assert len(packed_choices["input_ids"]) < len(choices)
    torch.testing.assert_close(packed["loglikelihood"], padded["loglikelihood"])
    assert packed["num_tokens"].tolist() == padded["num_tokens"].tolist()

    queries = training_queries(list(piqa_small["train"])[:16], wrapper.tokenizer, max_length)
    gradients = []
    for batch in (collate(queries, wrapper.pad_token_id), packed_batch(queries, 0, 64)):
        wrapper.zero_grad()
        loss = wrapper(**batch)["loss"]
        loss.backward()
        gradients.append((loss, [p.grad.clone() for p in wrapper.parameters()]))
    (padded_loss, padded_grads), (packed_loss, packed_grads) = gradients
    torch.testing.assert_close(packed_loss, padded_loss)
    for packed_grad, padded_grad in zip(packed_grads, padded_grads):
        torch.testing.assert_close(packed_grad, padded_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU's attention kernels")
@pytest.mark.parametrize("autocast", [False, True])
def test_packed_batches_on_a_gpu_score_and_train_as_padded_rows(
    autocast: bool, tiny_model_dir: Path, piqa_small
) -> None:
    """On a GPU a padded batch takes SDPA's fused causal kernel, a packed one a masked kernel;
    labels and query ids stay on the CPU (``move_batch``)."""
    from conftest import choice_queries

    from tango_fairscale.data.batches import collate, packed_batch
    from tango_fairscale.runtime.devices import move_batch

    device = torch.device("cuda")
    wrapper = ModelWrapper(str(tiny_model_dir)).to(device)
    examples = list(piqa_small["validation"])[:32]
    queries = choice_queries(examples, wrapper.tokenizer, wrapper.max_length)
    results = []
    for batch in (collate(queries, 0), packed_batch(queries, 0, 8)):
        wrapper.zero_grad()
        with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
            outputs = wrapper(**move_batch(batch, device))
        outputs["loss"].backward()
        grads = [p.grad.clone() for p in wrapper.parameters()]
        results.append((outputs["loglikelihood"].detach(), outputs["loss"].detach(), grads))
    (padded_ll, padded_loss, padded_grads), (packed_ll, packed_loss, packed_grads) = results
    tolerance = {"rtol": 2e-2, "atol": 5e-2} if autocast else {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(packed_ll, padded_ll, **tolerance)
    torch.testing.assert_close(packed_loss, padded_loss, **tolerance)
    for packed_grad, padded_grad in zip(packed_grads, padded_grads):
        torch.testing.assert_close(packed_grad, padded_grad, rtol=5e-2, atol=5e-3)


def test_packing_needs_an_attention_that_takes_masks(tiny_model_dir: Path) -> None:
    wrapper = ModelWrapper(str(tiny_model_dir))
    wrapper.model.config._attn_implementation = "flash_attention_2"
    assert not wrapper.supports_packing


@pytest.mark.parametrize("packed", [False, True])
def test_forward_reads_no_tensor_on_the_host(
    packed: bool, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``bool(tensor)`` in the forward (transformers' packed-sequence check made one per
    forward: a GPU wait); the check is back in place afterwards."""
    from transformers import masking_utils

    from tango_fairscale.data.batches import collate, packed_batch
    from tango_fairscale.data.queries import Query

    wrapper = ModelWrapper(str(tiny_model_dir)).eval()
    queries = [Query(tuple(range(10, 30)), 5), Query(tuple(range(10, 22)), 3)]
    batch = (packed_batch if packed else collate)(queries, wrapper.pad_token_id)
    detect = masking_utils.find_packed_sequence_indices
    host_reads = []
    as_bool = torch.Tensor.__bool__

    def recording_bool(tensor: torch.Tensor) -> bool:
        host_reads.append(tensor.shape)
        return as_bool(tensor)

    monkeypatch.setattr(torch.Tensor, "__bool__", recording_bool)
    with torch.no_grad():
        wrapper(**batch)
    assert host_reads == []
    assert masking_utils.find_packed_sequence_indices is detect
    with torch.no_grad():  # the check this guards against is real: it reads a tensor
        wrapper.model.base_model(input_ids=batch["input_ids"], use_cache=False)
    assert host_reads
