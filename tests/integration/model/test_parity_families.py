"""Every verified decoder family (``tests/helpers/families.py``): 3 steps of 2-process
``fairscale`` and ``fsdp2`` end with DDP's weights, every family and engine trained in one spawned
process group (``helpers.group.train_many``). Their scores are ``tests/model/test_families.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.families import VERIFIED_FAMILIES, save_family

from tango_fairscale.model.causal_lm import ModelWrapper

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

    from tango_fairscale.tasks.training_pairs import training_pairs

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
