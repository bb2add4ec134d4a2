"""A wrapping strategy, the part of an engine that differs from one engine to the next (Lightning
Fabric's strategy): it wraps the model and owns gradient synchronisation, clipping, the grad
scaler, the model's state in and out of checkpoints, the full state for export and the checkpoint
format. :class:`~.engine.Engine` composes one with a precision and runs the shared step.

:class:`Strategy`'s defaults are those of an engine whose rank holds the whole model (``ddp``,
``pipe``); a strategy overrides only where its wrapper differs.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from tango.integrations.torch import TrainConfig

from ..model.causal_lm import ModelWrapper
from .checkpoint_format import CheckpointFormat
from .precision import Precision
from .rank_files import RankFiles
from .sharding import ShardingConfig, apply_checkpointing, selected_units


@dataclass(frozen=True)
class Placement:
    """Where a strategy wraps: this process's device, the resolved precision, the job."""

    device: torch.device
    precision: Precision
    job: TrainConfig


class Strategy(ABC):
    """How an engine wraps the model and holds its state. Set up once (:meth:`setup`), then
    :meth:`wrap` once; every other method takes the wrapped model."""

    #: Whether every rank holds different model/optimizer state (and so writes its own file).
    sharded: ClassVar[bool] = False
    #: Whether :meth:`wrap` puts the whole model on this process's device (so the model may be
    #: put there before it is wrapped).
    whole_model_on_device: ClassVar[bool] = False

    placement: Placement

    def setup(self, placement: Placement) -> None:
        """Take ``placement``; refuse (one line) what this strategy cannot run there, before any
        work."""
        self.placement = placement

    def compute_devices(self, device: torch.device) -> list[torch.device]:
        """The devices this process computes on, given its own ``device``: that one."""
        return [device]

    def on_one_gpu(self) -> Strategy:
        """The strategy that runs once set up: this one; a sharded one gives way to
        :class:`OneDeviceStrategy` where it would shard over one GPU (nothing to shard, its
        wrapper's hooks cost host time every step)."""
        return self

    @abstractmethod
    def wrap(self, model: ModelWrapper) -> torch.nn.Module:
        """``model`` (converted to the precision's dtype) on the device, wrapped."""

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager:
        """Skip gradient synchronisation (for micro-batches before the last)."""
        no_sync = getattr(model, "no_sync", None)
        return no_sync() if no_sync is not None else contextlib.nullcontext()

    def clip_grad_norm(self, model: Any, max_norm: float) -> torch.Tensor:
        """Clip the global gradient norm to ``max_norm``; the norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    def grad_scaler(self) -> Any:
        """The fp16 grad scaler (``16-mixed``)."""
        return torch.amp.GradScaler(self.placement.device.type)

    def optimizer_step(self, step: Callable[[], None]) -> None:
        """Run ``step`` (unscale, clip, update) with whatever this wrapper needs around it."""
        step()

    def check_micro_batch(self, batch: dict[str, Any]) -> None:
        """Refuse (one line) a training micro-batch this wrapper cannot take."""
        return None

    def accepts_packed_batches(self, model: ModelWrapper) -> bool:
        """Whether the forwards take packed batches: where the model's attention does."""
        return model.supports_packing

    # --- state ----------------------------------------------------------------------------------

    def model_state(self, model: Any) -> dict[str, torch.Tensor]:
        """This rank's model state for a checkpoint (the full state when not sharded)."""
        return unwrap(model).state_dict()

    def load_model_state(self, model: Any, state: dict[str, torch.Tensor]) -> None:
        unwrap(model).load_state_dict(state)

    def model_layout(self, model: Any) -> dict[str, Any]:
        """What a rank file carries besides :meth:`model_state` so that the full model can be
        rebuilt offline from the files (nothing when that state is the full state)."""
        return {}

    def full_model_state(self, model: Any) -> dict[str, torch.Tensor] | None:
        """The complete model state on rank 0 (``None`` elsewhere). Call on every rank."""
        if self.placement.job.worker_id != 0:
            return None
        return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}

    def checkpoint_format(self) -> CheckpointFormat:
        """The layout of this engine's checkpoints: rank 0's file, by default."""
        return RankFiles()


class OneDeviceStrategy(Strategy):
    """The bare model on this process's device (Lightning's single-device strategy).

    :param checkpointed: where activations are recomputed in the backward, the names of those
        modules of the model (a function of it); each runs under torch's non-reentrant
        checkpoint, which a CUDA graph can hold (:mod:`.graphs`)."""

    whole_model_on_device = True

    def __init__(self, checkpointed: Callable[[ModelWrapper], list[str]] | None = None) -> None:
        self.checkpointed = checkpointed

    def wrap(self, model: ModelWrapper) -> torch.nn.Module:
        if self.checkpointed is not None:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                checkpoint_wrapper,
            )

            apply_checkpointing(model, self.checkpointed(model), checkpoint_wrapper)
        return model.to(self.placement.device)


class ShardedStrategy(Strategy):
    """A sharding wrapper's (``fairscale``, ``fsdp2``): every rank holds its own state; the
    engine's ``sharding`` block."""

    sharded = True

    def __init__(self, sharding: ShardingConfig) -> None:
        self.sharding = sharding

    def checkpointed_modules(self, model: ModelWrapper) -> list[str]:
        """The modules of ``model`` that ``sharding`` activation-checkpoints, refused (one line)
        where this wrapper would refuse them."""
        return selected_units(model, self.sharding)[1]

    def on_one_gpu(self) -> Strategy:
        """On one GPU, with nothing the wrapper does besides sharding and activation
        checkpointing (no CPU offload, no compiled units; not fp16, whose sharded grad scaler the
        GPU tests cover), the bare model, its :meth:`checkpointed_modules` checkpointed: the same
        training, without the wrapper's host work, and replayed from CUDA graphs
        (:mod:`.graphs`)."""
        placement, sharding = self.placement, self.sharding
        alone = placement.job.world_size == 1 and placement.device.type == "cuda"
        wraps = sharding.cpu_offload or sharding.compile
        if not alone or wraps or placement.precision.needs_grad_scaler:
            return self
        checkpointing = bool(sharding.activation_checkpointing)
        bare = OneDeviceStrategy(self.checkpointed_modules if checkpointing else None)
        bare.setup(placement)
        return bare


def unwrap(model: torch.nn.Module) -> ModelWrapper:
    """Peel DDP / FSDP / flatten wrappers off ``model`` down to the :class:`ModelWrapper`."""
    while not isinstance(model, ModelWrapper):
        inner = getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            raise TypeError(f"no ModelWrapper inside {type(model).__name__}")
        model = inner
    return model
