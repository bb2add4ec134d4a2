"""The engines' config checked before anything is built (``Engine.check_config``), and their
shared step on a GPU: an fp16 overflow under ``16-mixed`` is skipped and logged.

``16-mixed`` needs CUDA (it is refused on CPU, tested in ``test_hostile_input.py``), so these
tests run only where a GPU is visible (``scripts/gpu_tests.sh`` runs them on the lent H200s).
For each engine at world size 1: a backward pass through an infinite loss makes the grad scaler
skip the optimizer step (weights unchanged, loss scale halved, ``skipped_steps`` 1, a warning in
the log); the next finite step updates the weights.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import REPO_ROOT, assert_close_by_key, engine_config

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="16-mixed needs a GPU")


@pytest.mark.parametrize(
    "fields, world_size, message",
    [
        ({"type": "tango_fairscale::fairscale", "shardng": {}}, 1, "did you mean 'sharding'"),
        ({"type": "tango_fairscale::fsdp2", "precision": "bf16"}, 1, "unknown precision 'bf16'"),
        ({"type": "tango_fairscale::ddp", "max_grad_norm": 0}, 1, "max_grad_norm must be"),
        (
            {"type": "tango_fairscale::fairscale", "sharding": {"modules_to_wrap": "h"}},
            1,
            "sharding.modules_to_wrap must be a list of regexes",
        ),
        ({"type": "tango_fairscale::pipe", "pipe": {"chunks": 0}}, 1, "chunks"),
        ({"type": "tango_fairscale::pipe"}, 2, "set device_count=1"),
        ({"type": "tango_fairscale::ddp", "float8": "rowwize"}, 1, "unknown float8 'rowwize'"),
        (
            {"type": "tango_fairscale::fsdp2", "float8": "tensorwise", "precision": "32-true"},
            1,
            "float8 computes around bf16: set precision to 'bf16-mixed'",
        ),
    ],
)
def test_an_engine_block_is_refused_in_one_line_before_anything_is_built(
    fields: dict, world_size: int, message: str
) -> None:
    from tango.common.exceptions import ConfigurationError

    from tango_fairscale.compat import check_engine_config

    with pytest.raises(ConfigurationError, match=message) as error:
        check_engine_config(lazy_engine(fields), world_size)
    assert "\n" not in str(error.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="refused where no GPU is")
def test_float8_on_a_machine_without_gpus_is_refused_before_anything_is_built() -> None:
    from tango.common.exceptions import ConfigurationError

    from tango_fairscale.compat import check_engine_config

    fields = {"type": "tango_fairscale::fairscale", "float8": "tensorwise"}
    message = "float8 needs NVIDIA GPUs .*, and this machine has none; remove float8"
    with pytest.raises(ConfigurationError, match=message) as error:
        check_engine_config(lazy_engine(fields), 1)
    assert "\n" not in str(error.value)


def test_the_engine_names_are_the_registered_engines_and_the_configs_engines() -> None:
    """``ENGINES`` (the command line's choices) is every engine the package registers, and the
    configs' ``engine(name, ...)`` gives each its registered type (evaluated by rjsonnet, as
    Tango evaluates configs)."""
    import rjsonnet
    from tango.common.util import import_module_and_submodules
    from tango.integrations.torch import TrainingEngine

    from tango_fairscale.parallel import ENGINES

    import_module_and_submodules("tango_fairscale.parallel")
    registered = TrainingEngine.list_available()
    ours = [name for name in registered if name.startswith("tango_fairscale::")]
    assert sorted(ours) == sorted(f"tango_fairscale::{name}" for name in ENGINES)
    library = REPO_ROOT / "configs" / "lib" / "engines.libsonnet"
    schedule = "{warmup_steps: 0, train_steps: 1, decay: 'constant'}"
    for name in ENGINES:
        snippet = f"(import '{library}').engine('{name}', '32-true', 0.1, {schedule}).type"
        engine_type = json.loads(rjsonnet.evaluate_snippet("engine", snippet))
        assert engine_type == f"tango_fairscale::{name}"


def test_a_good_engine_block_and_other_engines_pass_the_check() -> None:
    from tango_fairscale.compat import check_engine_config
    from tango_fairscale.parallel import ENGINES

    for engine in ENGINES:
        check_engine_config(lazy_engine(engine_config(f"tango_fairscale::{engine}")), 1)
    sharding = {"modules_to_wrap": ["h"], "activation_checkpointing": True}
    check_engine_config(lazy_engine(engine_config("tango_fairscale::fsdp2", sharding=sharding)), 4)
    check_engine_config(lazy_engine({"type": "torch::naive"}), 2)  # Tango's own: not ours to check
    check_engine_config(None, 1)


def lazy_engine(fields: dict):
    from tango.common import Lazy, Params
    from tango.integrations.torch import TrainingEngine

    return Lazy(TrainingEngine, Params(fields))


def build_engine(engine: str, model_dir: Path, work_dir: Path):
    from tango.common import Lazy, Params
    from tango.integrations.torch import Model, TrainConfig, TrainingEngine

    config = TrainConfig("fp16", work_dir, devices=[0], world_size=1, is_distributed=False)
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)}))
    params = Params(engine_config(f"tango_fairscale::{engine}", precision="16-mixed"))
    return Lazy(TrainingEngine, params).construct(train_config=config, model=model)


def one_step(engine, batch: dict, loss_factor: float) -> None:
    loss, _ = engine.forward_train(batch, 0, 1)
    engine.backward(loss * loss_factor)
    engine.step()


@needs_gpu
@pytest.mark.parametrize("name", ["ddp", "fairscale", "fsdp2"])
def test_fp16_overflow_skips_the_step_and_logs_it(
    name: str, tiny_model_dir: Path, piqa_small, tmp_path: Path, caplog
) -> None:
    from conftest import training_queries

    from tango_fairscale.data.batches import training_batch

    engine = build_engine(name, tiny_model_dir, tmp_path)
    try:
        model = engine.wrapped_model
        queries = training_queries(list(piqa_small["train"])[:4], model.tokenizer, model.max_length)
        batch = training_batch(queries, model.pad_token_id, model.max_length)
        before = engine.full_model_state()
        scale = engine.grad_scaler.get_scale()

        with caplog.at_level(logging.WARNING):
            one_step(engine, batch, float("inf"))
        assert engine.skipped_steps == 1
        assert engine.grad_scaler.get_scale() == scale / 2
        assert "fp16 gradient overflow: optimizer step skipped" in caplog.text
        unchanged = engine.full_model_state()
        assert_close_by_key(unchanged, before)

        one_step(engine, batch, 1.0)
        assert engine.skipped_steps == 1
        after = engine.full_model_state()
        assert any(not torch.equal(after[key], value) for key, value in before.items())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
