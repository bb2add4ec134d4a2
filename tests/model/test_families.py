"""Every verified decoder family, as a tiny seeded model saved like a hub checkpoint:

* its scores through the package (padded, and packed where it takes packed batches) equal a
  plain Hugging Face full forward of the same directory, computed here, to 1e-4 (+1e-6 relative)
  in fp32; the families whose forward transforms the logits (Gemma-2/3's soft cap, Cohere's and
  Granite's scales, ...) also at large logits, where the transform shows;
* families whose logits the package does not reproduce are refused at load in one line;
* (slow) 3 steps of 2-process ``fairscale`` and ``fsdp2`` end with DDP's weights, every family and
  engine trained in one spawned process group (``helpers.group.train_many``).

``VERIFIED_FAMILIES`` (tests/helpers/families.py) is the README's list of verified families.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
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
    from tango.common.exceptions import ConfigurationError

    directory = save_family(tmp_path / family, family, tokenizer_dir)
    with pytest.raises(ConfigurationError, match="is not supported") as error:
        ModelWrapper(str(directory))
    assert "\n" not in str(error.value)


# 2-process parity over the families (slow) ---------------------------------------------------

PARITY_STEPS = 3


ENGINES = ("ddp", "fairscale", "fsdp2")


def train_families(root: Path, model_dirs: dict[str, Path], pairs) -> dict:
    """``PARITY_STEPS`` steps of every engine of ``ENGINES`` on 2 processes for each model of
    ``model_dirs``, all in one spawned process group (``helpers.group.train_many``); the final
    weights by ``"engine/family"``."""
    from conftest import engine_config
    from helpers.group import train_many
    from tango.common import Lazy, Params
    from tango.integrations.torch import Model, TrainConfig, TrainingEngine

    from tango_fairscale.train.loop import TrainPlan, TrainRuntime

    plans = {}
    for engine in ENGINES:
        for family, model_dir in model_dirs.items():
            config = TrainConfig(
                family,
                root / engine / family,
                train_steps=PARITY_STEPS,
                checkpoint_every=100,
                validate_every=None,
                log_every=1,
                is_distributed=True,
                devices=[-1, -1],
                world_size=2,
            )
            params = Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)})
            engine_params = Params(engine_config(f"tango_fairscale::{engine}"))
            plans[f"{engine}/{family}"] = TrainPlan(
                config,
                Lazy(Model, params),
                Lazy(TrainingEngine, engine_params),
                pairs,
                [],
                8,
                TrainRuntime(eval_batch_size=8, pack_sequences=None),
            )
    runs = train_many(plans)
    failed = [run for run in runs.values() if isinstance(run, str)]
    assert not failed, failed
    return {name: run.state_dict() for name, run in runs.items()}  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory, tokenizer_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {f: save_family(root / f, f, tokenizer_dir) for f in sorted(VERIFIED_FAMILIES)}


@pytest.fixture(scope="module")
def family_pairs(piqa_small):
    from conftest import piqa_task

    from tango_fairscale.tasks.lm_eval import training_pairs

    return training_pairs(piqa_task(list(piqa_small["train"])[:32], split="train"), "piqa")


@pytest.fixture(scope="module")
def family_weights(tmp_path_factory, family_dirs, family_pairs) -> dict:
    return train_families(tmp_path_factory.mktemp("family-runs"), family_dirs, family_pairs)


@pytest.fixture(scope="module")
def initial_weights(family_dirs) -> dict:
    return {family: ModelWrapper(str(path)).state_dict() for family, path in family_dirs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["fairscale", "fsdp2"])
def test_sharded_engines_end_with_ddps_weights_on_every_family(
    engine, initial_weights, family_weights
) -> None:
    from conftest import assert_same_weights

    for family, initial in initial_weights.items():
        expected = family_weights[f"ddp/{family}"]
        moved = [key for key in expected if not torch.equal(expected[key], initial[key])]
        assert moved, f"{family}: training changed no weight"
        assert_same_weights(expected, family_weights[f"{engine}/{family}"], context=family)
