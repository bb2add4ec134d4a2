"""Pipeline stages equal the model's own forward and gradients for every family they split (tiny
random configs, fp32, CPU); other models and unsupported features are refused in one line."""

import copy
import dataclasses

import pytest
import torch
from helpers.families import FAMILY_CONFIGS, VOCAB, tiny_model
from tango.common.exceptions import ConfigurationError
from torch import nn

from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.model.stages import FAMILIES, auto_balance, build_stages, partition
from tango_fairscale.model.stages.family import full_attention

# Right-padded rows wider than the sliding windows (8), the first 3 tokens of each unscored.
LENGTHS = (24, 17, 9, 20)
PROMPT = 3


def padded_rows(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    width = max(LENGTHS)
    ids = torch.randint(1, vocab, (len(LENGTHS), width), generator=generator)
    positions = torch.arange(width)
    real = positions < torch.tensor(LENGTHS)[:, None]
    ids = ids * real  # padding: id 0 after each row
    labels = torch.where(real & (positions >= PROMPT), ids, -100)
    return ids, real.long(), labels


def own_forward(model, ids, labels, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's summed log-likelihood of its labels (summed in float64, as the scorer does) and
    the loss (the mean over rows of the per-token NLL), from the model's own logits
    (ModelWrapper's shift: input t predicts t + 1)."""
    kwargs = {} if mask is None else {"attention_mask": mask[:, :-1]}
    logits = model(input_ids=ids[:, :-1], use_cache=False, **kwargs).logits.float()
    targets = labels[:, 1:]
    scored = targets != -100
    logprobs = torch.log_softmax(logits, dim=-1)
    token_ll = logprobs.gather(-1, targets.clamp(min=0)[..., None])[..., 0] * scored
    loss = (-token_ll.sum(dim=1) / scored.sum(dim=1)).mean()
    return token_ll.double().sum(dim=1), loss


def perturbed(name, tokenizer_dir, **overrides) -> nn.Module:
    """The family's tiny model with its norm weights moved off their initial values (Gemma's
    ``1 + w`` norms start at ``w = 0``), so that a norm left out or applied twice shows."""
    model = tiny_model(name, tokenizer_dir, **overrides).model
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if "norm" in parameter_name or ".ln" in parameter_name:
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return model


def test_every_supported_family_has_a_tiny_config() -> None:
    assert set(FAMILY_CONFIGS) == set(FAMILIES)


@pytest.mark.parametrize("name", sorted(FAMILY_CONFIGS))
def test_stages_equal_the_model(name, tokenizer_dir) -> None:
    """Two stages give each row's log-likelihood and every parameter's gradient of the model's
    own forward (with or without the padding mask: equal on real tokens), one tied parameter."""
    model = perturbed(name, tokenizer_dir)
    reference = copy.deepcopy(model)
    ids, mask, labels = padded_rows(model.config.vocab_size)
    built = build_stages(model, [1, 1])
    row_mean, row_nll, num_tokens = built.stages((ids[:, :-1], labels[:, 1:]))

    expected_ll, expected_loss = own_forward(reference, ids, labels)
    torch.testing.assert_close(-row_nll, expected_ll, rtol=1e-6, atol=1e-5)
    with torch.no_grad():
        masked_ll, _ = own_forward(reference, ids, labels, mask)
    torch.testing.assert_close(-row_nll, masked_ll, rtol=1e-6, atol=1e-5)
    assert num_tokens.tolist() == [length - PROMPT for length in LENGTHS]

    row_mean.mean().backward()
    if built.tied is not None:
        built.tied.merge_grads()
    expected_loss.backward()
    expected = dict(reference.named_parameters())
    scale = max(p.grad.abs().max() for p in expected.values() if p.grad is not None)
    for parameter_name, parameter in model.named_parameters():
        want = expected[parameter_name].grad
        assert (parameter.grad is None) == (want is None), parameter_name
        if want is not None:
            torch.testing.assert_close(
                parameter.grad, want, rtol=0, atol=1e-5 * scale, msg=parameter_name
            )
    # A tied head stays one parameter; the mirror is none of the model's.
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert (built.tied is not None) == tied
    if built.tied is not None:
        assert all(p is not built.tied.mirror for p in model.parameters())


def staged_difference(model, reference) -> float:
    ids, _, labels = padded_rows(model.config.vocab_size)
    with torch.no_grad():
        row_nll = build_stages(model, [1, 1]).stages((ids[:, :-1], labels[:, 1:]))[1]
        expected, _ = own_forward(reference, ids, labels)
    return (-row_nll - expected).abs().max().item()


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("mistral", {}),  # sliding-window masks on every layer
        ("qwen2", {}),  # a sliding-window mask on layer 1
        # The window covers every row, so only Gemma 3's local rotary base differs.
        ("gemma3_text", {"sliding_window": 128}),
    ],
)
def test_the_comparison_can_fail(name, overrides, tokenizer_dir, monkeypatch) -> None:
    """Treating every layer as full attention (its masks and rotary embeddings) is detected."""
    model = perturbed(name, tokenizer_dir, **overrides)
    reference = copy.deepcopy(model)
    assert staged_difference(model, reference) < 1e-4
    wrong = dataclasses.replace(FAMILIES[name], kinds=full_attention)
    monkeypatch.setitem(FAMILIES, name, wrong)
    assert staged_difference(model, reference) > 1e-3


def assert_one_line(error: pytest.ExceptionInfo, *parts: str) -> None:
    message = str(error.value)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, message


SUPPORTED_LIST = "it splits model types gemma, gemma2, gemma3_text, gpt2, gpt_neox, llama, "


def test_other_families_are_refused(tokenizer_dir) -> None:
    config = {"model_type": "bloom", "n_layer": 2, "hidden_size": 32, "n_head": 2}
    model = ModelWrapper(config={**config, "vocab_size": VOCAB}, tokenizer=str(tokenizer_dir)).model
    with pytest.raises(ConfigurationError) as error:
        build_stages(model, [1, 1])
    assert_one_line(
        error,
        "the pipe engine cannot split BloomForCausalLM (model_type 'bloom')",
        SUPPORTED_LIST,
        "opt, qwen2, qwen3, smollm3",
        "use engine ddp, fairscale or fsdp2",
    )


@pytest.mark.parametrize(
    "name, overrides, part",
    [
        ("opt", {"layerdrop": 0.1}, "layerdrop=0.1 skips layers at random"),
        ("gemma3_text", {"use_bidirectional_attention": True}, "bidirectional attention"),
        ("gpt2", {"add_cross_attention": True}, "cross-attention"),
    ],
)
def test_unsupported_features_are_refused(name, overrides, part, tokenizer_dir) -> None:
    model = tiny_model(name, tokenizer_dir, **overrides).model
    with pytest.raises(ConfigurationError) as error:
        build_stages(model, [1, 1])
    assert_one_line(error, f"(model_type {FAMILY_CONFIGS[name]['model_type']!r})", part)


def test_unknown_layouts_are_refused(tokenizer_dir) -> None:
    """A module the table does not name, or a missing one, is refused, not silently dropped."""
    model = tiny_model("llama", tokenizer_dir).model
    model.model.extra = nn.Linear(2, 2)
    with pytest.raises(ConfigurationError) as error:
        build_stages(model, [1, 1])
    assert_one_line(error, "parameters outside its stages (model.extra.weight")
    del model.model.norm
    with pytest.raises(ConfigurationError) as error:
        build_stages(model, [1, 1])
    assert_one_line(error, "not laid out as this version expects", "norm")


def test_balance(tokenizer_dir) -> None:
    """By parameter count: the tied embedding and its mirror dominate the end stages."""
    assert partition([1, 1, 1, 1], 2) == [2, 2]
    assert partition([1, 1, 1, 1], 2, first=2) == [1, 3]
    assert partition([5, 1, 1, 1, 1, 1], 3)[0] == 1
    assert partition([1, 1], 4) == [1, 1]
    model = tiny_model("llama", tokenizer_dir, num_hidden_layers=4).model
    assert auto_balance(model, 2) == [2, 2]
    assert auto_balance(model, 3) == [1, 2, 1]
    built = build_stages(model, [1, 2, 1])
    layers = [list(stage.layers) for stage in built.stages]
    assert [len(group) for group in layers] == [1, 2, 1]
    assert [layer for group in layers for layer in group] == list(model.model.layers)
    with pytest.raises(ConfigurationError, match=r"positive layer counts summing to 4"):
        build_stages(model, [2, 1])
