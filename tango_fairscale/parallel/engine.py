"""The package's one engine: a wrapping strategy (:mod:`.strategy`: how a model is wrapped and its
state held) composed with a precision (:mod:`.precision`'s ``Precision`` and ``LossScaling``) and
the strategy's checkpoint format (:mod:`.checkpoint_format`: the layout on disk); it runs the
shared step: micro-batches with ``no_sync``, clipping, the optimizer step.

An engine is a Tango ``TrainingEngine``; each registered one (``ddp``, ``fairscale``, ``fsdp2``,
``pipe``) only builds its strategy from its config keys. Our ``tango_fairscale::train`` and Tango's
own ``torch::train`` both drive engines; for the latter,
:meth:`Engine.save_complete_weights_from_checkpoint` consolidates offline
(:mod:`~tango_fairscale.parallel.consolidate`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, ClassVar

import torch
from tango.common import Lazy
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import LRScheduler, Model, Optimizer, TrainConfig, TrainingEngine

from .. import compat  # noqa: F401  (Tango fixes)
from ..checks import one_of, positive_number
from ..model.causal_lm import ModelWrapper
from ..records.checkpoints import Identity, run_id
from ..runtime.devices import move_batch
from ..runtime.process_group import join_process_group
from . import consolidate
from .backward_step import BackwardStep
from .float8 import (
    apply_float8,
    check_float8,
    check_float8_machine,
    check_float8_setting,
    warn_if_uncompiled,
)
from .graphs import GraphedSteps
from .optimizer import build_optimizer
from .precision import PRECISIONS, LossScaling, resolve_precision
from .sharding import ShardingConfig, has_compiled_module
from .strategy import Placement, ShardedStrategy, Strategy, unwrap


class Engine(TrainingEngine):
    """A :class:`~.strategy.Strategy` composed with a precision and a checkpoint format (not
    registered itself: the registered engines build its strategy).

    :param strategy: how the model is wrapped and its state held.
    :param precision: ``auto``, ``32-true``, ``bf16-mixed``, ``16-mixed`` or ``bf16-true``.
    :param max_grad_norm: clip the global gradient norm to this value (``None``: no clipping).
    :param float8: ``tensorwise`` or ``rowwise``: the transformer blocks' matmuls in float8
        (:mod:`.float8`; bf16 precisions on H100-class GPUs, with torchao); ``None``: none.
    """

    #: Why this engine cannot generate text (``generate_until`` tasks; asked of the registered
    #: class before it is built); ``None``: it can.
    generation_refusal: ClassVar[str | None] = None

    def __init__(
        self,
        train_config: TrainConfig,
        model: Model | Lazy[Model],
        optimizer: Lazy[Optimizer],
        strategy: Strategy,
        *,
        lr_scheduler: Lazy[LRScheduler] | None = None,
        precision: str = "auto",
        max_grad_norm: float | None = None,
        float8: str | None = None,
    ) -> None:
        positive_number("max_grad_norm", max_grad_norm, optional=True)
        if train_config.val_metric_name != "loss":  # set by torch::train's config only
            raise ConfigurationError(
                f"val_metric_name {train_config.val_metric_name!r}: the model's only validation "
                "metric is 'loss'; for PIQA / lm-eval accuracy during training use the "
                "tango_fairscale::train step (validate_every)"
            )
        self.device = train_config.worker_local_default_device
        self.precision = resolve_precision(precision, self.device)
        self.float8 = float8
        if float8 is not None:
            check_float8(float8, self.precision, strategy.compute_devices(self.device))
        self.max_grad_norm = max_grad_norm
        strategy.setup(Placement(self.device, self.precision, train_config))
        self.strategy = strategy = strategy.on_one_gpu()
        # Our training worker has joined the job's process group; an engine built elsewhere (by
        # Tango's torch::train, say) joins it here. FSDP needs one even alone.
        if strategy.sharded or train_config.is_distributed:
            join_process_group(train_config)
        self._no_sync = contextlib.ExitStack()
        super().__init__(train_config, model, optimizer, lr_scheduler=lr_scheduler)
        scaler = strategy.grad_scaler() if self.precision.needs_grad_scaler else None
        self.loss_scaling = LossScaling(scaler)
        self.checkpoint_format = strategy.checkpoint_format()
        #: Steps replayed from CUDA graphs (:mod:`.graphs`) where they can be: the bare model on
        #: one GPU, no fp16 loss scaling, no compiled units; their optimizer updates inside the
        #: backward where they train alike (:mod:`.backward_step`), freeing the gradients.
        self.graphs = None
        if self._replays():
            clips, accumulates = max_grad_norm is not None, train_config.grad_accum
            in_backward = BackwardStep.applies(
                self.optimizer, clips, accumulates, self.lr_scheduler
            )
            steps = BackwardStep(self.optimizer) if in_backward else None
            self.graphs = GraphedSteps(self.wrapped_model, self.precision, steps)

    @classmethod
    def check_config(cls, fields: dict[str, Any], world_size: int) -> None:
        """Refuse in one line, before any model or process exists, an engine block (``fields``, its
        config as written) that building this engine would refuse: a key it does not take, a
        ``precision`` or ``max_grad_norm`` out of range, a config block (``sharding``, ``pipe``)
        that fails its own checks, a number of processes it cannot run on."""
        import inspect

        from tango.common import FromParams, Params

        parameters = inspect.signature(cls.__init__).parameters
        unknown = {key: value for key, value in fields.items() if key not in parameters}
        unknown.pop("type", None)
        if unknown:  # Tango's own message, with the closest field and the list of fields
            Params(unknown).assert_empty(cls.__name__)
        one_of("precision", fields.get("precision", "auto"), PRECISIONS)
        if fields.get("float8") is not None:
            check_float8_setting(fields["float8"], fields.get("precision", "auto"))
            check_float8_machine()
        positive_number("max_grad_norm", fields.get("max_grad_norm"), optional=True)
        for name, parameter in parameters.items():
            block = fields.get(name)
            if isinstance(parameter.default, FromParams) and isinstance(block, dict):
                type(parameter.default).from_params(Params(dict(block)))
        cls.check_world_size(world_size)

    @classmethod
    def check_world_size(cls, world_size: int) -> None:
        """Refuse (one line) a number of processes this engine cannot run on; any, by default."""

    # --- construction -------------------------------------------------------------------------

    def _construct_model(self, model: Model | Lazy[Model]) -> Model:
        if isinstance(model, Lazy):
            model = model.construct()
        if not isinstance(model, ModelWrapper):
            raise ConfigurationError(
                f"the engine needs a 'tango_fairscale::causal_lm' model, got {type(model).__name__}"
            )
        # Probed whole, before it is wrapped: on the GPU where the whole fp32 model goes anyway.
        on_gpu = self.device.type == "cuda" and self.strategy.whole_model_on_device
        if on_gpu and self.precision.param_dtype == torch.float32:
            model.to(self.device)
        model.probe()
        converted: ModelWrapper = self.precision.convert_module(model)
        if self.float8 is not None:
            apply_float8(converted, self.float8)
        wrapped = self.strategy.wrap(converted)
        if self.float8 is not None:
            warn_if_uncompiled(wrapped)
        return wrapped  # type: ignore[return-value]

    def _construct_optimizer(self, optimizer: Lazy[Optimizer]) -> Optimizer:
        # FairScale's and FSDP2's fp16 grad scalers fail inside fused steps (torch 2.11).
        scaled = self.precision.needs_grad_scaler and self.strategy.sharded
        return build_optimizer(optimizer, list(self.model.parameters()), fused_allowed=not scaled)

    @property
    def grad_scaler(self) -> Any | None:
        """The fp16 grad scaler (``16-mixed`` only; its state is in every checkpoint)."""
        return self.loss_scaling.grad_scaler

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps the fp16 grad scaler skipped."""
        return self.loss_scaling.skipped_steps

    @property
    def wrapped_model(self) -> ModelWrapper:
        """The :class:`ModelWrapper` inside the engine's wrappers (for its tokenizer and config)."""
        return unwrap(self.model)

    @property
    def accepts_packed_batches(self) -> bool:
        """Whether ``forward_train`` / ``forward_eval`` take packed batches
        (:func:`~tango_fairscale.data.batches.packed_batch`)."""
        return self.strategy.accepts_packed_batches(self.wrapped_model)

    def _replays(self) -> bool:
        return (
            self.device.type == "cuda"
            and not self.train_config.is_distributed
            and self.model is self.wrapped_model
            and self.grad_scaler is None
            and not has_compiled_module(self.model)
            and self.float8 is None  # float8's captured steps: not measured
        )

    # --- the training step --------------------------------------------------------------------

    def forward_train(
        self, micro_batch: dict[str, Any], micro_batch_idx: int, num_micro_batches: int
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        self.strategy.check_micro_batch(micro_batch)
        self._check_batch(micro_batch)
        if micro_batch_idx == 0:  # a graph's gradients stay allocated
            self.optimizer.zero_grad(set_to_none=self.graphs is None)
        if micro_batch_idx < num_micro_batches - 1:
            self._no_sync.enter_context(self.strategy.no_sync(self.model))
        micro_batch = move_batch(micro_batch, self.device)
        with self.precision.forward_context(self.device):
            outputs = self.model(**micro_batch)
        return outputs["loss"] / num_micro_batches, outputs

    def forward_eval(self, batch: dict[str, Any]) -> dict[str, Any]:
        self._check_batch(batch)
        batch = move_batch(batch, self.device)
        with torch.no_grad(), self.precision.forward_context(self.device):
            return self.model(**batch)

    def _check_batch(self, batch: dict[str, Any]) -> None:
        """Refuse a packed batch where it cannot be taken (our step refuses ``pack_sequences``
        up front; under ``torch::train`` the user's collator makes the batches)."""
        if "position_ids" in batch and not self.accepts_packed_batches:
            attention = self.wrapped_model.model.config._attn_implementation
            raise ConfigurationError(
                f"{type(self).__name__} with attention {attention!r} cannot take packed batches "
                "(with position_ids; the pipe engine never does): feed right-padded batches "
                "(input_ids, attention_mask, labels)"
            )

    def backward(self, loss: torch.Tensor) -> None:
        with self.precision.attention_kernels(self.device):
            self.loss_scaling.backward(loss)
        self._no_sync.close()

    def clip_grad_norm(self) -> torch.Tensor | None:
        if self.max_grad_norm is None:
            return None
        return self.strategy.clip_grad_norm(self.model, self.max_grad_norm)

    def step(self) -> None:
        if self.graphs is not None and self.graphs.stepped:  # updated inside the backward
            self.graphs.stepped = False
        else:
            self.strategy.optimizer_step(
                lambda: self.loss_scaling.optimizer_step(self.optimizer, self.clip_grad_norm)
            )
        # Gradients are not needed again before the next step's first backward: free them now
        # (less memory in validation; FairScale leaves sharded gradients on gathered parameters,
        # which a compiled unit's next forward would refuse) unless a graph writes into them.
        if self.graphs is None or self.graphs.backward_step is not None:
            self.optimizer.zero_grad(set_to_none=True)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    # --- state (the strategy's; :mod:`.checkpoint_format` saves and restores it) ----------------

    def model_state(self) -> dict[str, torch.Tensor]:
        return self.strategy.model_state(self.model)

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        self.strategy.load_model_state(self.model, state)

    def model_layout(self) -> dict[str, Any]:
        return self.strategy.model_layout(self.model)

    def full_model_state(self) -> dict[str, torch.Tensor] | None:
        """The complete model state on rank 0 (``None`` elsewhere). Call on every rank."""
        return self.strategy.full_model_state(self.model)

    def save_checkpoint(self, checkpoint_dir: Path, client_state: dict[str, Any]) -> None:
        """Tango's API (``torch::train`` calls it on every rank): write the checkpoint's files and
        its manifest into ``checkpoint_dir`` (:meth:`.CheckpointFormat.save`; the caller makes it
        final). The step is ``client_state["step"]`` (ours) or ``["training_steps"]``
        (``torch::train``'s); the run id is kept beside the checkpoint directory."""
        directory = Path(checkpoint_dir)
        step = int(client_state.get("step", client_state.get("training_steps", 0)))
        identity = Identity(run_id(directory.parent), step, self.train_config.world_size)
        self.checkpoint_format.save(self, directory, client_state, identity)

    def load_checkpoint(self, checkpoint_dir: Path) -> dict[str, Any]:
        """Tango's API (call on every rank): verify and load ``checkpoint_dir``; its client
        state (:meth:`.CheckpointFormat.restore`: one-line errors)."""
        return self.checkpoint_format.restore(self, Path(checkpoint_dir))

    def save_complete_weights_from_checkpoint(
        self, checkpoint_dir: Path, weights_path: Path
    ) -> None:
        """Tango ``torch::train``'s last call, on rank 0 alone (the other ranks have returned):
        the full weights of ``checkpoint_dir``, consolidated from its files without a collective,
        saved as ``weights_path``. In one process ``self.model``, which ``torch::train`` returns
        next, becomes a plain :class:`ModelWrapper` holding them (not the wrapped model)."""
        checkpoint_dir = Path(checkpoint_dir).resolve()
        state = consolidate.full_state_dict(checkpoint_dir)
        temporary = weights_path.with_name(weights_path.name + ".tmp")
        torch.save(state, temporary)
        os.replace(temporary, weights_path)
        if not self.train_config.is_distributed and (
            self.strategy.sharded or self.model is not self.wrapped_model
        ):
            self.model = consolidate.plain_model(checkpoint_dir, state)


DEFAULT_SHARDING = ShardingConfig()


class ShardedEngine(Engine):
    """Base of the sharded engines (``fairscale``, ``fsdp2``): their shared ``sharding`` field,
    from which each builds its :attr:`strategy_type`.

    :param sharding: a :class:`~tango_fairscale.parallel.sharding.ShardingConfig`.
    """

    strategy_type: ClassVar[type[ShardedStrategy]]

    def __init__(
        self,
        train_config: TrainConfig,
        model: Model | Lazy[Model],
        optimizer: Lazy[Optimizer],
        *,
        lr_scheduler: Lazy[LRScheduler] | None = None,
        precision: str = "auto",
        max_grad_norm: float | None = None,
        float8: str | None = None,
        # Not ``ShardingConfig | None``: Tango would replace an error inside the block by
        # "Failed to construct argument sharding" (it tries each member of a union).
        sharding: ShardingConfig = DEFAULT_SHARDING,
    ) -> None:
        super().__init__(
            train_config,
            model,
            optimizer,
            type(self).strategy_type(sharding or DEFAULT_SHARDING),
            lr_scheduler=lr_scheduler,
            precision=precision,
            max_grad_norm=max_grad_norm,
            float8=float8,
        )
