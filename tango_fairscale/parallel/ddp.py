"""Plain data parallelism: every rank holds the whole model, gradients are all-reduced."""

from __future__ import annotations

import torch
from tango.common import Lazy
from tango.integrations.torch import LRScheduler, Model, Optimizer, TrainConfig, TrainingEngine
from torch.nn.parallel import DistributedDataParallel

from ..model.causal_lm import ModelWrapper
from .engine import Engine
from .sharding import default_unit_patterns, select_modules
from .strategy import Strategy


class DDPStrategy(Strategy):
    """Torch ``DistributedDataParallel`` (a single process trains the bare model); ``compile``:
    ``torch.compile`` each transformer block first. Everything else is :class:`Strategy`'s."""

    whole_model_on_device = True

    def __init__(self, compile: bool = False) -> None:
        self.compile = compile

    def wrap(self, model: ModelWrapper) -> torch.nn.Module:
        device = self.placement.device
        model = model.to(device)
        if self.compile:
            for name in select_modules(model, default_unit_patterns(model), "compile"):
                model.get_submodule(name).compile()
        if not self.placement.job.is_distributed:
            return model
        device_ids = [device] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)


@TrainingEngine.register("tango_fairscale::ddp")
class DDPEngine(Engine):
    """Torch ``DistributedDataParallel`` (a single process trains the bare model).

    Registered as a Tango ``TrainingEngine`` under the name ``"tango_fairscale::ddp"``. The baseline
    every sharded engine must reproduce. Fields: ``precision``, ``max_grad_norm`` (see
    :class:`~tango_fairscale.parallel.engine.Engine`), ``optimizer`` / ``lr_scheduler`` as in Tango,
    and ``compile``: ``torch.compile`` each transformer block (the first steps take longer while
    it compiles; then fewer, fused kernels).

    Example (Jsonnet)::

        engine: {type: "tango_fairscale::ddp", precision: "bf16-mixed", compile: true,
                 optimizer: {type: "torch::AdamW", lr: 1e-5, fused: true}}
    """

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
        compile: bool = False,
    ) -> None:
        # The engine's fields are restated, not taken as ``**kwargs``: with ``**kwargs`` Tango
        # hands unknown config keys through, and a typo would end in a TypeError instead of the
        # one-line "did you mean ..." error (tests/test_hostile_input.py).
        super().__init__(
            train_config,
            model,
            optimizer,
            DDPStrategy(compile),
            lr_scheduler=lr_scheduler,
            precision=precision,
            max_grad_norm=max_grad_norm,
            float8=float8,
        )
