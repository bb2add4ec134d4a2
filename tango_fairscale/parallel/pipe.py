"""Pipeline parallelism: a decoder cut into stages on several devices, driven by one process.

FairScale's ``Pipe`` (GPipe schedule: every micro-batch forward, then every backward) runs the
stages that :mod:`tango_fairscale.model.stages` builds (GPT-2, the Llama family, GPT-NeoX, OPT).
The engine's ``forward_train`` / ``forward_eval`` take the same right-padded batches and return
the same outputs as every other engine, so the training loop, in-loop validation and
consolidation need not know which stage is the last.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from fairscale.nn import Pipe
from fairscale.nn.pipe.pipeline import Pipeline
from tango.common import FromParams, Lazy
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import LRScheduler, Model, Optimizer, TrainConfig, TrainingEngine
from torch import nn

from ..checks import one_of, positive_int, positive_int_list
from ..model.causal_lm import ModelWrapper
from ..model.loss import loss_outputs
from ..model.stages import StagePrecision, TiedWeight, auto_balance, build_stages, num_layers
from .engine import Engine
from .strategy import Strategy

CHECKPOINT_MODES = ("never", "always", "except_last")


@dataclass(frozen=True)
class PipeConfig(FromParams):
    """How the ``pipe`` engine cuts the model and its batches (its ``pipe`` block, beside the
    sharded engines' ``sharding``), checked when built; devices are resolved when the engine is.

    :param balance: decoder layers per stage, e.g. ``[6, 6]`` (the embeddings join the first
        stage, the final norm, LM head and loss the last); ``null`` balances the parameter count
        over ``len(devices)`` stages.
    :param chunks: micro-batches each batch is cut into (at most the rows of a batch,
        ``batch_size / grad_accum``).
    :param checkpoint: activation checkpointing of the micro-batches: ``never``, ``always`` or
        ``except_last`` (FairScale's default).
    :param devices: one device per stage, e.g. ``["cuda:0", "cuda:1"]``; default: every visible
        GPU, or two CPU stages without GPUs.
    """

    balance: list[int] | None = None
    chunks: int = 4
    checkpoint: str = "except_last"
    devices: list[str] | None = None

    def __post_init__(self) -> None:
        positive_int("pipe.chunks", self.chunks)
        one_of("pipe.checkpoint", self.checkpoint, CHECKPOINT_MODES)
        if self.balance is not None:
            positive_int_list("pipe.balance", self.balance, "layer counts per stage")
        if self.devices is not None and (not isinstance(self.devices, list) or not self.devices):
            raise ConfigurationError(
                f'pipe.devices must be a non-empty list such as ["cuda:0", "cuda:1"] or '
                f'["cpu", "cpu"], got {self.devices!r}'
            )


#: The ``pipe`` block when an engine config gives none.
DEFAULT_PIPE = PipeConfig()


class _Pipeline(Pipeline):
    """FairScale's pipeline, minus a hang at interpreter exit.

    ``Pipeline.__del__`` joins its worker threads by waiting for each to answer; a pipe still
    alive when Python shuts down is deleted after its daemon threads have stopped, and the wait
    never ends. At shutdown there is nothing to join (and module globals such as ``sys`` may
    already be ``None``: the check is bound at class creation).
    """

    _finalizing = staticmethod(sys.is_finalizing)

    def __del__(self) -> None:
        if not self._finalizing():
            super().__del__()


class PipelinedModel(nn.Module):
    """The :class:`ModelWrapper` (as ``module``, so ``unwrap`` finds it) and its ``Pipe``.

    ``forward`` takes ``ModelWrapper.forward``'s right-padded batches (never packed ones) and
    returns its outputs, on ``output_device`` whichever device the last stage is on.
    """

    def __init__(
        self,
        wrapper: ModelWrapper,
        pipe: Pipe,
        output_device: torch.device,
        tied: TiedWeight | None,
    ) -> None:
        super().__init__()
        self.module = wrapper  # registered first: parameters() keeps the wrapper's order
        self.pipe = pipe
        self.output_device = output_device
        self.tied = tied

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        query_ids: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        if position_ids is not None or query_ids is not None:
            raise ValueError(
                "the pipe engine takes right-padded batches only: Pipe cuts a batch into "
                "micro-batches of rows, which packed rows would tie together"
            )
        del attention_mask
        first = self.pipe.devices[0]
        # As ModelWrapper.forward: position t is predicted from positions < t, and the padding
        # mask is not needed (padding only follows a row's tokens). Only batch-first tensors
        # cross the stages, so that Pipe can cut every one of them into micro-batches.
        inputs = (input_ids[:, :-1].to(first), labels[:, 1:].to(first))
        outputs = self.pipe(inputs)
        return loss_outputs(*(tensor.to(self.output_device) for tensor in outputs))


class PipeStrategy(Strategy):
    """FairScale ``Pipe`` over ``devices`` (:class:`PipeConfig`): the whole model
    in one process, so rank 0's file and :class:`Strategy`'s state; a tied head's mirror merged
    around each step and refreshed after each load."""

    def __init__(self, config: PipeConfig) -> None:
        self.devices = resolve_devices(config.devices)
        balance = config.balance
        if balance is not None and len(balance) > len(self.devices):
            raise ConfigurationError(
                f"pipe.balance {balance} has {len(balance)} stages but pipe.devices has only "
                f"{len(self.devices)} ({', '.join(map(str, self.devices))}); add devices or use "
                "fewer stages"
            )
        self.balance = None if balance is None else list(balance)
        self.chunks = config.chunks
        self.checkpoint = config.checkpoint
        self.tied: TiedWeight | None = None
        self.stage_devices: list[torch.device] = []  # once wrapped: one per stage

    def compute_devices(self, device: torch.device) -> list[torch.device]:
        return list(self.devices)  # every stage's, whichever device the process names

    def wrap(self, model: ModelWrapper) -> torch.nn.Module:
        layers = num_layers(model.model)  # refuses models it cannot split
        if self.balance is None:
            self.balance = auto_balance(model.model, len(self.devices))
        elif sum(self.balance) != layers:
            raise ConfigurationError(
                f"pipe.balance {self.balance} sums to {sum(self.balance)} but the model has "
                f"{layers} decoder layers; make the entries sum to {layers}"
            )
        self.stage_devices = devices = self.devices[: len(self.balance)]
        precision = StagePrecision(
            self.placement.precision.compute_dtype, self.placement.precision.mixed
        )
        stages = build_stages(
            model.model, self.balance, devices[-1], precision, model.logit_transform
        )
        # Pipe moves each stage's modules (the wrapper's own modules) to its device.
        with warnings.catch_warnings():
            # "upstreamed to torch.distributed.pipeline.sync": that module is gone from torch.
            warnings.filterwarnings("ignore", "fairscale.nn.Pipe has been upstreamed")
            pipe = Pipe(
                stages.stages,
                balance=[1] * len(stages.stages),
                devices=devices,
                chunks=self.chunks,
                checkpoint=self.checkpoint,
            )
        pipe.pipeline.__class__ = _Pipeline
        self.tied = stages.tied
        if self.tied is not None:
            self.tied.sync()
        return PipelinedModel(model, pipe, self.placement.device, self.tied)

    def accepts_packed_batches(self, model: ModelWrapper) -> bool:
        # Pipe cuts batches into micro-batches of rows; packed rows would tie them together.
        return False

    def check_micro_batch(self, batch: dict[str, Any]) -> None:
        rows = len(batch["input_ids"])
        if rows < self.chunks:
            raise ConfigurationError(
                f"pipe.chunks={self.chunks} exceeds the {rows} examples of each micro-batch "
                f"(batch_size / (device_count × grad_accum)); set chunks to at most {rows}"
            )

    def optimizer_step(self, step: Callable[[], None]) -> None:
        if self.tied is not None:
            self.tied.merge_grads()  # before unscaling, clipping and the update
        step()
        if self.tied is not None:
            self.tied.sync()

    def load_model_state(self, model: Any, state: dict[str, torch.Tensor]) -> None:
        super().load_model_state(model, state)
        if self.tied is not None:
            self.tied.sync()


@TrainingEngine.register("tango_fairscale::pipe")
class PipeEngine(Engine):
    """FairScale ``Pipe``: the model's layers split over ``pipe.devices``, batches cut into
    ``pipe.chunks``.

    Registered as a Tango ``TrainingEngine`` under the name ``"tango_fairscale::pipe"``.
    One process drives every stage (run it with ``device_count: 1``). It splits the model types
    :data:`~tango_fairscale.model.stages.SUPPORTED` (GPT-2; Llama, SmolLM, Mistral, Qwen2/3,
    SmolLM3, Gemma 1-3; GPT-NeoX; OPT) and refuses any other in one line.

    :param pipe: the stages, micro-batches and their checkpointing (:class:`PipeConfig`).
    :param precision: as every engine (autocast is applied inside each stage).
    :param max_grad_norm: clip the global gradient norm.

    An LM head tied to the token embedding (GPT-2, OPT, SmolLM, Gemma): the last stage holds a
    copy of that weight whose gradient is added to the embedding's before each step and which is
    refreshed after it.

    Example (Jsonnet)::

        engine: {type: "tango_fairscale::pipe",
                 pipe: {balance: [6, 6], chunks: 4, checkpoint: "except_last",
                        devices: ["cuda:0", "cuda:1"]},
                 precision: "bf16-mixed", optimizer: {type: "torch::AdamW", lr: 1e-5}}
    """

    generation_refusal = (
        "the pipe engine does not generate text (generate_until): validate generation tasks "
        "under ddp, fairscale or fsdp2, or score them after training with "
        "tango_fairscale::task_scores"
    )

    @classmethod
    def check_world_size(cls, world_size: int) -> None:
        """Refuse (one line) more than one process; Tango's ``torch::train`` asks before it spawns
        (``tango_fairscale.compat``)."""
        if world_size != 1:
            raise ConfigurationError(
                f"the pipe engine drives all its stages from one process; set device_count=1 "
                f"(got {world_size}) and list the stages' devices in pipe.devices"
            )

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
        pipe: PipeConfig = DEFAULT_PIPE,
    ) -> None:
        self.check_world_size(train_config.world_size)
        super().__init__(
            train_config,
            model,
            optimizer,
            PipeStrategy(pipe),
            lr_scheduler=lr_scheduler,
            precision=precision,
            max_grad_norm=max_grad_norm,
            float8=float8,
        )


def resolve_devices(devices: list[str] | None) -> list[torch.device]:
    """The stages' devices: as given, else every visible GPU, else two CPU stages."""
    if devices is None:
        if torch.cuda.is_available():
            return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
        return [torch.device("cpu"), torch.device("cpu")]
    resolved = []
    for name in devices:
        try:
            device = torch.device(name)
        except (RuntimeError, TypeError):
            raise ConfigurationError(
                f'pipe.devices entry {name!r} is not a device; write e.g. "cuda:0" or "cpu"'
            ) from None
        if device.type == "cuda":
            visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
            index = 0 if device.index is None else device.index
            if index >= visible:
                raise ConfigurationError(
                    f"pipe.devices entry {name!r} is not available ({visible} visible GPUs); "
                    'list visible GPUs or use "cpu"'
                )
            device = torch.device("cuda", index)
        elif device.type != "cpu":
            raise ConfigurationError(
                f'pipe.devices entry {name!r}: the pipe engine runs on "cuda:N" or "cpu" devices'
            )
        resolved.append(device)
    return resolved
