"""torch-native FSDP2 (``fully_shard``), with distributed checkpoints that reshard on load."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import torch
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import TrainingEngine
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..model.causal_lm import ModelWrapper
from .checkpoint_format import CheckpointFormat
from .distributed_checkpoint import DistributedCheckpoint
from .engine import ShardedEngine
from .sharding import apply_sharding, selected_units
from .strategy import ShardedStrategy

# torch.distributed.fsdp and torch.distributed.checkpoint are imported where a model is sharded or
# its state gathered: they import DTensor and sympy (~0.8 s), which a ``tango run`` that trains
# nothing (every step cached) does not pay; the fork server imports them once (FSDP2_CODE).
if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

logger = logging.getLogger(__name__)

#: The torch modules this engine and its checkpoints (:mod:`.distributed_checkpoint`) import only
#: when they are used: a fork server imports them once for its workers
#: (:func:`~tango_fairscale.train.launch.component_modules`).
FSDP2_CODE = (
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
)


class FSDP2Strategy(ShardedStrategy):
    """torch FSDP2: ``fully_shard`` on each selected unit and the root, parameters as DTensors;
    checkpoints through ``torch.distributed.checkpoint`` (:class:`DistributedCheckpoint`)."""

    def wrap(self, model: ModelWrapper) -> torch.nn.Module:
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

        config, device = self.sharding, self.placement.device
        units, checkpointed = selected_units(model, config)
        options: dict[str, Any] = {
            "reshard_after_forward": config.reshard_after_forward,
            "mp_policy": self._mixed_precision_policy(),
        }
        if config.hybrid_shard:
            options["mesh"] = self._hybrid_mesh()
        if config.cpu_offload:
            options["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
        else:
            model = model.to(device)
        return apply_sharding(
            model,
            units,
            checkpointed,
            checkpoint=checkpoint_wrapper,
            shard=lambda module: cast(torch.nn.Module, fully_shard(module, **options)),
            compile=config.compile,
        )

    def _hybrid_mesh(self) -> DeviceMesh:
        """``(nodes, processes per node)``: shard along the second dimension, replicate along
        the first."""
        world_size = self.placement.job.world_size
        # The launcher's processes per node; one node holds every process without a launcher.
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        if world_size % per_node:
            raise ConfigurationError(
                f"sharding.hybrid_shard needs the same number of processes on every node; "
                f"{world_size} processes do not split into nodes of {per_node}"
            )
        shape = (world_size // per_node, per_node)
        logger.info("hybrid sharding: %d replica(s) x %d shard(s)", *shape)
        device_type = self.placement.device.type
        return init_device_mesh(device_type, shape, mesh_dim_names=("replicate", "shard"))

    def _mixed_precision_policy(self) -> MixedPrecisionPolicy:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        precision = self.placement.precision
        if not precision.mixed:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=precision.compute_dtype, reduce_dtype=torch.float32)

    def grad_scaler(self) -> Any:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler()

    def no_sync(self, model: FSDPModule) -> contextlib.AbstractContextManager:
        return _gradient_sync(model, enabled=False)

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> torch.Tensor:
        # Gradients are DTensors: the norm is reduced over the shards by DTensor itself.
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return total.full_tensor() if hasattr(total, "full_tensor") else total

    def checkpoint_format(self) -> CheckpointFormat:
        return DistributedCheckpoint()  # resharded on load; the model's state through DCP's API

    def full_model_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=options)  # all ranks take part
        if self.placement.job.worker_id != 0:
            return None
        return {key: value for key, value in state.items() if isinstance(value, torch.Tensor)}


@TrainingEngine.register("tango_fairscale::fsdp2")
class FSDP2Engine(ShardedEngine):
    """torch FSDP2: ``fully_shard`` on each unit and the root; the FairScale engine's config.

    Registered as a Tango ``TrainingEngine`` under the name ``"tango_fairscale::fsdp2"``.

    :param precision: ``bf16-mixed`` / ``16-mixed`` gather parameters in the low precision and
        reduce gradients in fp32 (``MixedPrecisionPolicy``); ``bf16-true`` keeps bf16 parameters.
    :param max_grad_norm: clip the global gradient norm.
    :param sharding: a :class:`~tango_fairscale.parallel.sharding.ShardingConfig`
        (``flatten_parameters`` has no effect: FSDP2 shards every parameter on its own);
        ``compile`` applies ``torch.compile`` to each unit, after activation checkpointing and
        before sharding; ``hybrid_shard`` shards within each node and replicates across nodes
        (a 2-D device mesh, replicas × processes per node).

    Checkpoints are ``torch.distributed.checkpoint`` directories (plus the model's config and
    tokenizer): a run saved on N processes resumes on any number.

    Example (Jsonnet)::

        engine: {type: "tango_fairscale::fsdp2", precision: "bf16-mixed",
                 sharding: {activation_checkpointing: true, compile: true},
                 optimizer: {type: "torch::AdamW", lr: 1e-5}}
    """

    strategy_type = FSDP2Strategy


@contextlib.contextmanager
def _gradient_sync(model: FSDPModule, enabled: bool) -> Iterator[None]:
    model.set_requires_gradient_sync(enabled)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
