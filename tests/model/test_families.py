"""Every verified decoder family, as a tiny seeded model saved like a hub checkpoint:

* its scores through the package (padded, and packed where it takes packed batches) equal a
  plain Hugging Face full forward of the same directory, computed here, to 1e-4 (+1e-6 relative)
  in fp32; the families whose forward transforms the logits (Gemma-2/3's soft cap, Cohere's and
  Granite's scales, ...) also at large logits, where the transform shows;
* families whose logits the package does not reproduce are refused in one line, as evaluation
  loads them and as an engine takes them to train.

Their 2-process training parity is ``tests/integration/model/test_parity_families.py``.

``VERIFIED_FAMILIES`` (tests/helpers/families.py) is the README's list of verified families.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import engine_config
from helpers.families import (
    REFUSED_FAMILIES,
    VERIFIED_FAMILIES,
    package_scores,
    reference_scores,
    save_family,
)

from tango_fairscale.model.causal_lm import ModelWrapper

#: Families whose own forward transforms the logits: the head's scale giving large logits.
TRANSFORMED = {"gemma2": 1000.0, "gemma3_text": 1000.0, "cohere": 1000.0, "granite": 1000.0}
#: Gemma-3's checkpoints' soft cap (its config's default is none), and windows as long as the
#: models' 128 positions, so that these also score packed.
TRANSFORM_OVERRIDES: dict[str, dict[str, Any]] = {
    "gemma2": {"sliding_window": 128},
    "gemma3_text": {"final_logit_softcapping": 30.0, "sliding_window": 128},
}


@pytest.fixture(scope="module")
def examples(piqa_dir: Path) -> list[dict]:
    from tango_fairscale.tasks.piqa import read_piqa

    return list(read_piqa(piqa_dir, limit=3)["validation"])


#: Families scored padded only: Bloom (its ALiBi takes 2-D masks only) and those whose attention
#: windows (8 tokens here) are shorter than their 128 positions.
PADDED_ONLY = {"bloom", "gemma2", "gemma3_text", "gpt_neo", "mistral", "qwen2", "qwen3"}


#: Scored in the default tier (the rest in the slow one): a plain, a windowed, a soft-capped,
#: a scaled and a padded-only family.
DEFAULT_TIER = {"gpt2", "llama", "mistral", "gemma2", "cohere", "granite", "bloom"}


@pytest.mark.parametrize(
    "family",
    [
        f if f in DEFAULT_TIER else pytest.param(f, marks=pytest.mark.slow)
        for f in VERIFIED_FAMILIES
    ],
)
def test_family_scores_equal_its_own_forward(tmp_path, tokenizer_dir, examples, family) -> None:
    from conftest import choice_queries

    directory = save_family(tmp_path / family, family, tokenizer_dir)
    model = ModelWrapper(str(directory))
    queries = choice_queries(examples, model.tokenizer, model.max_length)
    expected = reference_scores(directory, queries)
    torch.testing.assert_close(package_scores(model, queries), expected, rtol=1e-6, atol=1e-4)
    assert model.supports_packing == (family not in PADDED_ONLY), family
    if model.supports_packing:
        got = package_scores(model, queries, packed=True)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("family", sorted(TRANSFORMED))
def test_scores_apply_the_models_logit_transform(tmp_path, tokenizer_dir, examples, family):
    from conftest import choice_queries

    directory = save_family(
        tmp_path / family, family, tokenizer_dir, **TRANSFORM_OVERRIDES.get(family, {})
    )
    model = ModelWrapper(str(directory))
    with torch.no_grad():
        model.model.get_output_embeddings().weight.mul_(TRANSFORMED[family])
    queries = choice_queries(examples, model.tokenizer, model.max_length)
    expected = reference_scores(directory, queries, head_scale=TRANSFORMED[family])
    assert expected.abs().max() > 100  # large logits: a dropped transform would show
    assert model.supports_packing
    for packed in (False, True):
        got = package_scores(model, queries, packed)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("family", sorted(REFUSED_FAMILIES))
def test_unsupported_families_are_refused_in_one_line(tmp_path, tokenizer_dir, family) -> None:
    from tango.common import Lazy, Params
    from tango.common.exceptions import ConfigurationError
    from tango.integrations.torch import Model, TrainConfig, TrainingEngine

    from tango_fairscale.evaluation.shared_model import ModelSource

    directory = save_family(tmp_path / family, family, tokenizer_dir)
    # As evaluation loads it, and as an engine takes it to train it.
    with pytest.raises(ConfigurationError, match="is not supported") as error:
        ModelSource({"model": str(directory)}).load(torch.device("cpu"), torch.float32)
    assert "\n" not in str(error.value)
    config = TrainConfig("refused", tmp_path, devices=[-1], world_size=1, is_distributed=False)
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(directory)}))
    engine = Lazy(TrainingEngine, Params(engine_config("tango_fairscale::ddp")))
    with pytest.raises(ConfigurationError, match="is not supported"):
        engine.construct(train_config=config, model=model)
