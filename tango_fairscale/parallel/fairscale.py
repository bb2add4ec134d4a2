"""FairScale's ``FullyShardedDataParallel``: parameters, gradients and optimizer state sharded."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from fairscale.internal.parallel import ProcessGroupName
from fairscale.nn.checkpoint import checkpoint_wrapper
from fairscale.nn.data_parallel import FullyShardedDataParallel as FSDP
from fairscale.optim.grad_scaler import ShardedGradScaler
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import TrainingEngine

from ..compat import fairscale as fairscale_fixes
from ..model.causal_lm import ModelWrapper
from .checkpoint_format import CheckpointFormat
from .engine import ShardedEngine
from .rank_files import RankFiles
from .sharding import apply_sharding, selected_units
from .strategy import Placement, ShardedStrategy


class FairScaleStrategy(ShardedStrategy):
    """FairScale FSDP on the selected units and the root: each rank holds and saves its own
    shards (with FairScale's layout, from which export rebuilds the full state); the full model
    is gathered for export."""

    def setup(self, placement: Placement) -> None:
        if placement.precision.name == "bf16-true":
            raise ConfigurationError(
                "the fairscale engine keeps fp32 master weights; use 'bf16-mixed' instead of "
                "'bf16-true' (or engine 'ddp' / 'fsdp2' for pure bf16)"
            )
        if self.sharding.hybrid_shard:
            raise ConfigurationError(
                "sharding.hybrid_shard is supported by the fsdp2 engine only; "
                "remove it or use fsdp2"
            )
        super().setup(placement)

    def wrap(self, model: ModelWrapper) -> torch.nn.Module:
        fairscale_fixes.quiet_storage_deprecation()
        fairscale_fixes.patch_fairscale_for_cpu()
        if dist.get_backend() == "gloo":
            fairscale_fixes.use_list_collectives_for_gloo()
        # Weights loaded from safetensors live in memory-mapped, fixed-size storage, which
        # FairScale frees by resizing to zero: give such parameters storage of their own.
        for parameter in model.parameters():
            if not parameter.untyped_storage().resizable():
                parameter.data = parameter.data.clone()
        units, checkpointed = self._checked_units(model)
        return apply_sharding(
            model,
            units,
            checkpointed,
            checkpoint=checkpoint_wrapper,
            shard=self._fsdp,
            compile=self.sharding.compile,
        )

    def checkpointed_modules(self, model: ModelWrapper) -> list[str]:
        return self._checked_units(model)[1]

    def _checked_units(self, model: ModelWrapper) -> tuple[list[str], list[str]]:
        """``(units, checkpointed)`` (:func:`selected_units`), checkpointing whole units only."""
        units, checkpointed = selected_units(model, self.sharding)
        check_checkpointed_units(units, checkpointed)
        return units, checkpointed

    def _fsdp(self, module: torch.nn.Module) -> FSDP:
        precision, device = self.placement.precision, self.placement.device
        offload = self.sharding.cpu_offload
        return FSDP(
            module if offload else module.to(device),
            # The job's own group (FairScale would make new ones, without its timeout).
            process_group=dist.group.WORLD,
            process_group_reduce_scatter=ProcessGroupName.default,
            reshard_after_forward=self.sharding.reshard_after_forward,
            flatten_parameters=self.sharding.flatten_parameters,
            mixed_precision=precision.mixed,
            compute_dtype=precision.compute_dtype if precision.mixed else None,
            buffer_dtype=torch.float32,
            fp32_reduce_scatter=precision.mixed,  # also keeps world-size-1 gradients fp32 (fix 6)
            move_params_to_cpu=offload,
            move_grads_to_cpu=offload,
            compute_device=device,
            state_dict_device=torch.device("cpu"),
        )

    def grad_scaler(self) -> Any:
        return ShardedGradScaler()

    def checkpoint_format(self) -> CheckpointFormat:
        return RankFiles(sharded=True, reshards=False)  # every rank's shards, FairScale's layout

    def no_sync(self, model: FSDP) -> Any:
        return model.no_sync()

    def clip_grad_norm(self, model: FSDP, max_norm: float) -> torch.Tensor:
        return fairscale_fixes.clip_grad_norm_(model, max_norm)

    def model_state(self, model: FSDP) -> dict[str, torch.Tensor]:
        return model.local_state_dict()

    def model_layout(self, model: FSDP) -> dict[str, Any]:
        # FairScale's own record of which parameters each flat shard holds (names, shapes,
        # padding): with it, consolidation needs neither the job nor the sharding config.
        return {
            "model_metadata": model.local_metadata_dict(),
            "world_size": self.placement.job.world_size,
        }

    def load_model_state(self, model: FSDP, state: dict[str, torch.Tensor]) -> None:
        fairscale_fixes.load_local_state_dict(model, state)

    def full_model_state(self, model: FSDP) -> dict[str, torch.Tensor] | None:
        state = model.state_dict()  # gathers every unit: all ranks take part
        if self.placement.job.worker_id != 0:
            return None
        # One copy each: a device tensor's copy to the host, or a host tensor's clone (a view of
        # a unit's full parameters, freed once they are resharded).
        return {key: value.detach().to("cpu", copy=True) for key, value in state.items()}


@TrainingEngine.register("tango_fairscale::fairscale")
class FairScaleEngine(ShardedEngine):
    """FairScale FSDP with regex-selected units, mixed precision, checkpointing and CPU offload
    (:class:`FairScaleStrategy`).

    Registered as a Tango ``TrainingEngine`` under the name ``"tango_fairscale::fairscale"``.

    :param precision: as for every engine; ``bf16-mixed`` / ``16-mixed`` keep fp32 sharded master
        weights, compute in the low precision and reduce gradients in fp32.
    :param max_grad_norm: clip the global gradient norm (computed over all shards).
    :param sharding: a :class:`~tango_fairscale.parallel.sharding.ShardingConfig`; its
        checkpointed modules must be units (see :func:`check_checkpointed_units`).

    Example (Jsonnet)::

        engine: {type: "tango_fairscale::fairscale", precision: "bf16-mixed",
                 sharding: {modules_to_wrap: ["model\\\\.transformer\\\\.h\\\\.[0-9]+"],
                            activation_checkpointing: true},
                 optimizer: {type: "torch::AdamW", lr: 1e-5}}
    """

    strategy_type = FairScaleStrategy


def check_checkpointed_units(units: list[str], checkpointed: list[str]) -> None:
    """Refuse checkpointing a module that is not a sharding unit of its own.

    FairScale's checkpoint wrapper runs the module's backward as a backward of its own, at whose
    end FairScale's hook frees the enclosing unit's gathered parameters: the rest of that unit's
    backward (or another checkpointed part's recomputation) then reads freed memory
    ("... its data is not allocated yet"; measured at world size 2 and, with mixed precision, 1).
    """
    inside = [name for name in checkpointed if name not in units]
    if inside:
        shown = ", ".join(repr(name) for name in inside[:3]) + (", ..." if len(inside) > 3 else "")
        raise ConfigurationError(
            f"the fairscale engine checkpoints whole sharding units only, and {shown} "
            f"{'is' if len(inside) == 1 else 'are'} not in modules_to_wrap; add "
            f"{'it' if len(inside) == 1 else 'them'} to modules_to_wrap, checkpoint the units "
            "(activation_checkpointing: true) or use the fsdp2 engine, which checkpoints any module"
        )
