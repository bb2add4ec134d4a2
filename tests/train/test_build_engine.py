"""The training loop's ``pack_sequences``: ``null`` (the configs' default) becomes whether the
engine's model takes packed batches; ``true`` on a model that does not (Bloom) is refused in one
line when the engine is built, before any step."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.families import save_family
from tango.common.exceptions import ConfigurationError


def plan_for(model_dir: Path, work_dir: Path, pack_sequences: bool | None):
    from conftest import engine_config
    from tango.common import Lazy, Params
    from tango.integrations.torch import Model, TrainConfig, TrainingEngine

    from tango_fairscale.train.loop import TrainPlan, TrainRuntime

    config = TrainConfig("test", work_dir, train_steps=1, devices=[-1], world_size=1)
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)}))
    engine = Lazy(TrainingEngine, Params(engine_config("tango_fairscale::ddp")))
    runtime = TrainRuntime(eval_batch_size=8, pack_sequences=pack_sequences)
    return TrainPlan(config, model, engine, [], [], 8, runtime)


def test_packing_follows_the_model_where_it_is_automatic(
    tmp_path: Path, tokenizer_dir: Path, tiny_model_dir: Path
) -> None:
    from tango_fairscale.train.loop import build_engine

    bloom = save_family(tmp_path / "bloom", "bloom", tokenizer_dir)
    plan = plan_for(bloom, tmp_path / "bloom-run", None)
    build_engine(plan)
    assert plan.runtime.pack_sequences is False
    plan = plan_for(tiny_model_dir, tmp_path / "gpt2-run", None)
    build_engine(plan)
    assert plan.runtime.pack_sequences is True

    with pytest.raises(ConfigurationError, match="scores packed queries as padded") as error:
        build_engine(plan_for(bloom, tmp_path / "refused", True))
    assert "set pack_sequences to null" in str(error.value) and "\n" not in str(error.value)
