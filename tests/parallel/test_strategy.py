"""The wrapping strategy's defaults (``parallel/strategy.py``), those of an engine whose rank holds
the whole model, through the DDP strategy in one process: its state in and out, the full state
on rank 0 only, clipping, gradient synchronisation skipped where the wrapper can, and
:func:`unwrap` down to the model; on one GPU a sharded strategy gives way to the bare model, its
checkpointed modules under torch's checkpoint."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import TrainConfig

from tango_fairscale.data.batches import collate
from tango_fairscale.data.queries import Query
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.parallel.ddp import DDPStrategy
from tango_fairscale.parallel.fairscale import FairScaleStrategy
from tango_fairscale.parallel.precision import resolve_precision
from tango_fairscale.parallel.rank_files import RankFiles
from tango_fairscale.parallel.sharding import ShardingConfig
from tango_fairscale.parallel.strategy import (
    OneDeviceStrategy,
    Placement,
    ShardedStrategy,
    unwrap,
)


def strategy(work_dir: Path, worker_id: int = 0) -> DDPStrategy:
    config = TrainConfig("test", work_dir, world_size=1, devices=[-1], worker_id=worker_id)
    cpu = torch.device("cpu")
    made = DDPStrategy()
    made.setup(Placement(cpu, resolve_precision("32-true", cpu), config))
    return made


@pytest.fixture
def model(tiny_model_dir: Path) -> ModelWrapper:
    return ModelWrapper(str(tiny_model_dir))


class Holder(torch.nn.Module):
    """A wrapper as DDP and FSDP are: the wrapped model is its ``module``."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module
        self.unsynced = 0

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        self.unsynced += 1
        yield


def test_unwrap_peels_every_wrapper_down_to_the_model(model: ModelWrapper) -> None:
    assert unwrap(model) is model
    assert unwrap(Holder(Holder(model))) is model
    with pytest.raises(TypeError, match="no ModelWrapper inside Linear"):
        unwrap(Holder(torch.nn.Linear(1, 1)))


def test_alone_the_model_is_trained_bare(tmp_path: Path, model: ModelWrapper) -> None:
    made = strategy(tmp_path)
    assert made.wrap(model) is model
    assert not made.sharded and isinstance(made.checkpoint_format(), RankFiles)
    assert made.accepts_packed_batches(model) == model.supports_packing
    assert isinstance(made.grad_scaler(), torch.amp.GradScaler)


def test_no_sync_is_the_wrappers_where_it_has_one(tmp_path: Path, model: ModelWrapper) -> None:
    made, holder = strategy(tmp_path), Holder(model)
    with made.no_sync(holder):
        pass
    assert holder.unsynced == 1
    with made.no_sync(model):  # a bare model syncs nothing
        pass


def test_the_state_goes_out_and_back_whole(tmp_path: Path, model: ModelWrapper) -> None:
    made = strategy(tmp_path)
    wrapped = Holder(model)
    state = {k: v.clone() for k, v in made.model_state(wrapped).items()}
    assert state.keys() == model.state_dict().keys() and made.model_layout(wrapped) == {}
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    made.load_model_state(wrapped, state)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


def test_the_full_state_is_rank_0s_detached_copy(tmp_path: Path, model: ModelWrapper) -> None:
    full = strategy(tmp_path).full_model_state(Holder(model))
    assert full is not None and full.keys() == model.state_dict().keys()
    weight = model.model.transformer.wte.weight
    copied = full["model.transformer.wte.weight"]
    assert torch.equal(copied, weight) and not copied.requires_grad
    assert strategy(tmp_path, worker_id=1).full_model_state(Holder(model)) is None


def test_clipping_returns_the_norm_before_it(tmp_path: Path, model: ModelWrapper) -> None:
    parameters = list(model.parameters())
    for parameter in parameters:
        parameter.grad = torch.full_like(parameter, 0.01)
    before = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters]))
    assert before > 0.5
    norm = strategy(tmp_path).clip_grad_norm(model, 0.5)
    assert float(norm) == pytest.approx(float(before), rel=1e-5)
    after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters]))
    assert float(after) == pytest.approx(0.5, rel=1e-4)


def test_the_optimizer_step_runs_once_and_sharded_strategies_keep_their_block(
    tmp_path: Path,
) -> None:
    steps: list[int] = []
    strategy(tmp_path).optimizer_step(lambda: steps.append(1))
    assert steps == [1]

    class Sharded(ShardedStrategy):
        def wrap(self, model: ModelWrapper) -> torch.nn.Module:
            return model

    sharding = ShardingConfig()
    assert Sharded(sharding).sharded and Sharded(sharding).sharding is sharding


def one_gpu_fairscale(work_dir: Path, sharding: ShardingConfig) -> FairScaleStrategy:
    """The fairscale strategy set up for one process on a GPU (no CUDA call is made)."""
    config = TrainConfig("test", work_dir, world_size=1, devices=[0])
    cuda = torch.device("cuda", 0)
    made = FairScaleStrategy(sharding)
    made.setup(Placement(cuda, resolve_precision("32-true", cuda), config))
    return made


def test_one_gpu_trains_the_bare_model_its_checkpointed_blocks_named(
    tmp_path: Path, model: ModelWrapper
) -> None:
    bare = one_gpu_fairscale(tmp_path, ShardingConfig(activation_checkpointing=True)).on_one_gpu()
    assert isinstance(bare, OneDeviceStrategy) and bare.checkpointed is not None
    assert bare.checkpointed(model) == [f"model.transformer.h.{i}" for i in range(2)]
    plain = one_gpu_fairscale(tmp_path, ShardingConfig()).on_one_gpu()
    assert isinstance(plain, OneDeviceStrategy) and plain.checkpointed is None
    offloaded = ShardingConfig(activation_checkpointing=True, cpu_offload=True)
    assert isinstance(one_gpu_fairscale(tmp_path, offloaded).on_one_gpu(), FairScaleStrategy)
    # What FairScale refuses on two GPUs is refused on one.
    inside = ShardingConfig(activation_checkpointing=["model\\.transformer\\.h\\.0\\.mlp"])
    refusing = one_gpu_fairscale(tmp_path, inside).on_one_gpu()
    assert isinstance(refusing, OneDeviceStrategy) and refusing.checkpointed is not None
    with pytest.raises(ConfigurationError, match="checkpoints whole sharding units only"):
        refusing.checkpointed(model)


def test_the_bare_models_checkpointed_blocks_give_the_same_gradients(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Checkpointed blocks recompute in the backward (CPU: bitwise); the state keeps its names."""
    plain, checkpointed = ModelWrapper(str(tiny_model_dir)), ModelWrapper(str(tiny_model_dir))
    names = [f"model.transformer.h.{i}" for i in range(2)]
    made = OneDeviceStrategy(lambda _: names)
    cpu = torch.device("cpu")
    config = TrainConfig("test", tmp_path, world_size=1, devices=[-1])
    made.setup(Placement(cpu, resolve_precision("32-true", cpu), config))
    wrapped = made.wrap(checkpointed)
    assert all(type(wrapped.get_submodule(name)).__name__ == "CheckpointWrapper" for name in names)
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    queries = [Query(tuple(range(5 + i, 30 + 3 * i)), 4 + i) for i in range(3)]
    for each in (plain, wrapped):
        each(**collate(queries, plain.pad_token_id))["loss"].backward()
    for (name, ours), theirs in zip(wrapped.named_parameters(), plain.parameters(), strict=True):
        assert ours.grad is not None and torch.equal(ours.grad, theirs.grad), name
