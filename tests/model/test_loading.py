"""Loading a model: fp32 master weights whatever the checkpoint stores, and one line (not a
traceback, not a silently broken model) for what cannot make a usable model.

* a bf16-stored Llama loads as fp32, scores like an independent fp32 forward and trains exactly
  like its fp32 copy;
* a directory without tokenizer files (transformers builds a near-empty tokenizer quietly) and
  an ``eos_token_id`` outside the tokenizer are refused in one line; so is a directory whose
  config names Python code of its own (``auto_map``): it never runs, even where transformers
  would ask whether it may and the answer is yes.
* a model rebuilt only to have a full state loaded over it (``weights_loaded_over``) draws no
  random number, and with that state equals the model it came from in every verified family.

A hub id with the hub unreachable (a fresh process each) is ``tests/integration/model/
test_hub_offline.py``.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from helpers.families import VERIFIED_FAMILIES, package_scores, reference_scores, save_family
from tango.common.exceptions import ConfigurationError

from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.model.loading import build_model, weights_loaded_over


def test_a_bf16_checkpoint_is_loaded_with_fp32_master_weights(
    tmp_path, tokenizer_dir, piqa_small
) -> None:
    from conftest import choice_queries

    directory = save_family(tmp_path / "llama", "llama", tokenizer_dir)
    bf16 = tmp_path / "llama-bf16"
    ModelWrapper(str(directory)).model.to(torch.bfloat16).save_pretrained(bf16)
    shutil.copy(directory / "tokenizer.json", bf16)
    shutil.copy(directory / "tokenizer_config.json", bf16)
    assert '"dtype": "bfloat16"' in (bf16 / "config.json").read_text()

    for model in (ModelWrapper(str(bf16)), ModelWrapper(str(bf16), config={})):
        assert {p.dtype for p in model.parameters()} == {torch.float32}
    model = ModelWrapper(str(bf16))
    queries = choice_queries(list(piqa_small["validation"])[:3], model.tokenizer, 128)
    torch.testing.assert_close(
        package_scores(model, queries), reference_scores(bf16, queries), rtol=1e-6, atol=1e-4
    )


def test_a_bf16_checkpoint_trains_like_its_fp32_copy(tmp_path, tokenizer_dir, piqa_small) -> None:
    """4 steps at 32-true: the same fp32 weights, bit for bit, whether the checkpoint stored the
    (bf16-representable) weights in bf16 or in fp32."""
    from conftest import assert_close_by_key, train_tiny

    fp32 = tmp_path / "fp32"
    model = ModelWrapper(str(save_family(tmp_path / "llama", "llama", tokenizer_dir)))
    with torch.no_grad():
        for parameter in model.parameters():  # values bf16 holds exactly
            parameter.copy_(parameter.to(torch.bfloat16))
    model.save(fp32)
    bf16 = tmp_path / "bf16"
    model.model.to(torch.bfloat16).save_pretrained(bf16)
    model.tokenizer.save_pretrained(bf16)

    a = train_tiny(tmp_path / "wa", bf16, piqa_small, train_steps=4).state_dict()
    b = train_tiny(tmp_path / "wb", fp32, piqa_small, train_steps=4).state_dict()
    assert all(value.dtype == torch.float32 for value in a.values())
    assert_close_by_key(a, b)


@pytest.mark.parametrize("family", ["gpt2", "gemma2"])
def test_a_directory_without_tokenizer_files_is_refused(tmp_path, tokenizer_dir, family) -> None:
    """GPT-2's files missing give a tokenizer of 0 tokens; Gemma's, one of 5 special tokens
    that encodes text as ``<unk>`` (not empty: a check for ``[]`` alone would miss it)."""
    directory = save_family(tmp_path / family, family, tokenizer_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (directory / name).unlink()
    with pytest.raises(ConfigurationError, match="does not encode text") as error:
        ModelWrapper(str(directory))
    assert "\n" not in str(error.value)


def test_a_directorys_own_python_code_never_runs(tmp_path, monkeypatch) -> None:
    import json

    from tango_fairscale.model.loading import load_config

    marker = tmp_path / "ran"
    directory = tmp_path / "remote"
    directory.mkdir()
    config = {"model_type": "remote_gpt", "auto_map": {"AutoConfig": "remote.RemoteConfig"}}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "remote.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from transformers import PretrainedConfig\n"
        "class RemoteConfig(PretrainedConfig):\n    model_type = 'remote_gpt'\n"
    )
    monkeypatch.setattr("builtins.input", lambda *args: "y")  # transformers' prompt, answered
    with pytest.raises(ConfigurationError) as error:
        load_config(str(directory))
    assert "\n" not in str(error.value)
    assert not marker.exists()


def test_an_eos_token_outside_the_vocabulary_is_refused(tokenizer_dir) -> None:
    config = {**VERIFIED_FAMILIES["gpt2"], "eos_token_id": 60000, "bos_token_id": 60000}
    with pytest.raises(ConfigurationError, match="eos_token_id 60000 is outside the tokenizer"):
        ModelWrapper(config=config, tokenizer=str(tokenizer_dir))


def test_the_load_probes_run_once_where_the_model_is_then(tiny_model_dir, monkeypatch) -> None:
    """Construction probes nothing; the first ``probe`` (or ``supports_packing``) probes the
    model where it is, and only once."""
    import tango_fairscale.model.causal_lm as causal_lm

    seen: list[str] = []

    def where(model, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(next(model.parameters()).device.type)
        return True

    # The meta device stands in for a GPU: the recording probes run nothing on it.
    monkeypatch.setattr(causal_lm, "check_fast_path", where)
    monkeypatch.setattr(causal_lm, "packing_matches_padding", where)
    model = ModelWrapper(str(tiny_model_dir))
    assert seen == []
    model.to(torch.device("meta"))
    assert model.supports_packing
    model.probe()
    assert seen == ["meta", "meta"]


@pytest.mark.parametrize("family", sorted(VERIFIED_FAMILIES))
def test_a_model_rebuilt_for_its_weights_equals_the_one_they_came_from(family) -> None:
    """Under ``weights_loaded_over`` a model skips its random initialisation; loaded with a
    model's state it has the same buffers (non-persistent ones too), ties and logits."""
    config = dict(VERIFIED_FAMILIES[family])
    original = build_model(None, config, seed=3).eval()
    torch.manual_seed(3)
    seeded = torch.get_rng_state()
    with weights_loaded_over():
        rebuilt = build_model(None, config, seed=3).eval()
    # Its memory may hold anything, even a freed model's equal weights: no random number drawn
    # after the seed is what shows that nothing was initialised.
    assert torch.equal(torch.get_rng_state(), seeded), "initialised anyway"
    rebuilt.load_state_dict(original.state_dict())  # strict
    originals = dict(original.named_buffers())
    rebuilts = dict(rebuilt.named_buffers())
    assert rebuilts.keys() == originals.keys()
    for name, buffer in originals.items():
        assert torch.equal(rebuilts[name], buffer), name
    assert len(list(rebuilt.parameters())) == len(list(original.parameters()))  # tied as built
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(rebuilt(ids).logits, original(ids).logits)
