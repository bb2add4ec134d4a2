"""Decoding with a key/value cache (``model/decoding.py``): the next-token logits equal the model's
own full forward at the last position, whatever is cached; the explicit masks equal what the
padding and causality allow; the cache's size per token, its rows kept, the end-of-sequence ids
and the generation-config fields that greedy decoding refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tango.common.exceptions import ConfigurationError

from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.model.decoding import (
    cache_bytes_per_token,
    check_generation_config,
    eos_token_ids,
    explicit_mask,
    keep_rows,
    new_cache,
    next_token_logits,
)


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path):
    wrapper = ModelWrapper(str(tiny_model_dir))
    wrapper.model.eval()
    return wrapper.model


def test_cached_decoding_gives_the_full_forwards_last_logits(model) -> None:
    """Two prompts (the second left-padded by two), then one token each after the cache: the
    logits equal a full forward over every token so far, to float32 rounding."""
    torch.manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(1, vocab, (2, 6))
    padding = torch.ones(2, 6, dtype=torch.long)
    padding[1, :2] = 0
    positions = (padding.cumsum(-1) - 1).clamp(min=0)
    cache = new_cache(model)
    with torch.no_grad():
        first = next_token_logits(model, ids, padding, positions, cache)["logits"]
        step = torch.randint(1, vocab, (2, 1))
        mask = torch.cat([padding, torch.ones(2, 1, dtype=torch.long)], dim=1)
        second = next_token_logits(model, step, mask, positions[:, -1:] + 1, cache)["logits"]
        for row, start in ((0, 0), (1, 2)):
            full = model(input_ids=torch.cat([ids, step], 1)[row : row + 1, start:]).logits
            torch.testing.assert_close(second[row], full[0, -1].float(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(first[row], full[0, -2].float(), rtol=1e-5, atol=1e-5)
    assert first.dtype == torch.float32 and first.shape == (2, vocab)


def test_an_explicit_mask_sees_the_unpadded_slots_up_to_its_own() -> None:
    padding = torch.tensor([[1, 1, 1, 1, 0], [0, 1, 1, 1, 0]])
    mask = explicit_mask(padding, queries=2, cached=2, implementation="sdpa")
    assert mask.shape == (2, 1, 2, 5) and mask.dtype == torch.bool
    assert mask[0, 0].tolist() == [[True, True, True, False, False], [True] * 4 + [False]]
    assert mask[1, 0].tolist() == [
        [False, True, True, False, False],
        [False] + [True] * 3 + [False],
    ]
    additive = explicit_mask(padding, queries=2, cached=2, implementation="eager")
    assert torch.equal(additive == 0, mask) and additive.min() == torch.finfo(torch.float32).min


def test_keep_rows_keeps_the_cache_of_the_rows_named(model) -> None:
    torch.manual_seed(1)
    ids = torch.randint(1, model.config.vocab_size, (3, 4))
    cache = new_cache(model)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    keys = [layer.keys.clone() for layer in cache.layers]
    keep_rows(cache, torch.tensor([2, 0]))
    for layer, before in zip(cache.layers, keys, strict=True):
        assert torch.equal(layer.keys, before[[2, 0]])


def test_the_cache_takes_keys_and_values_of_every_layer(model) -> None:
    config = model.config
    expected = config.n_layer * 2 * config.n_embd * 4  # every head: n_embd values, fp32
    assert cache_bytes_per_token(model, 4) == expected


def test_eos_ids_come_from_the_generation_config(model, monkeypatch) -> None:
    monkeypatch.setattr(model.generation_config, "eos_token_id", [5, 7])
    assert eos_token_ids(model) == {5, 7}
    monkeypatch.setattr(model.generation_config, "eos_token_id", 3)
    assert eos_token_ids(model) == {3}
    monkeypatch.setattr(model.generation_config, "eos_token_id", None)
    assert eos_token_ids(model) == set()


def test_a_generation_config_that_changes_greedy_decoding_is_refused(model, monkeypatch) -> None:
    check_generation_config(model, "tiny")  # the defaults change nothing
    monkeypatch.setattr(model.generation_config, "repetition_penalty", 1.3)
    with pytest.raises(ConfigurationError, match="repetition_penalty=1.3") as error:
        check_generation_config(model, "tiny")
    assert "generation_config.json" in str(error.value) and "\n" not in str(error.value)
