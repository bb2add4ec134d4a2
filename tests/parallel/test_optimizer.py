"""The engines' optimizer: fused on a GPU unless the config chooses, per-tensor on a CPU (where
the parity tests compare with DDP bit for bit)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import engine_config
from tango.common import Lazy, Params
from tango.integrations.torch import Model, Optimizer, TrainConfig, TrainingEngine

from tango_fairscale.parallel.optimizer import fused_by_default


@pytest.mark.parametrize(
    ("config", "fused"),
    [
        ({"type": "torch::AdamW", "lr": 1e-5}, True),
        ({"type": "torch::SGD", "lr": 1e-5}, True),
        ({"type": "torch::AdamW", "lr": 1e-5, "fused": False}, False),  # the config chose
        ({"type": "torch::Adam", "lr": 1e-5, "foreach": True}, False),  # fused excludes foreach
        ({"type": "torch::Adamax", "lr": 1e-5}, False),  # no fused implementation
    ],
)
def test_fused_by_default_only_where_the_config_leaves_it_open(config, fused) -> None:
    assert fused_by_default(Lazy(Optimizer, Params(config))) is fused


def build(engine: str, model_dir: Path, work_dir: Path, device: int) -> TrainingEngine:
    config = TrainConfig("opt", work_dir, devices=[device], world_size=1, is_distributed=False)
    model = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": str(model_dir)}))
    params = Params(engine_config(f"tango_fairscale::{engine}", precision="32-true"))
    return Lazy(TrainingEngine, params).construct(train_config=config, model=model)


def test_a_cpu_engine_keeps_the_per_tensor_update(tiny_model_dir, tmp_path) -> None:
    engine = build("ddp", tiny_model_dir, tmp_path, -1)
    assert not engine.optimizer.defaults.get("fused")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fused optimizers by default on GPUs")
@pytest.mark.parametrize("name", ["ddp", "fairscale", "fsdp2"])
def test_a_gpu_engine_fuses_the_update(name, tiny_model_dir, tmp_path) -> None:
    import torch.distributed as dist

    try:
        engine = build(name, tiny_model_dir, tmp_path, 0)
        assert engine.optimizer.defaults.get("fused") is True
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
