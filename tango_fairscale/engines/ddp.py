"""Plain data parallelism: every rank holds the whole model, gradients are all-reduced."""

from __future__ import annotations

from tango.integrations.torch import Model, TrainingEngine
from torch.nn.parallel import DistributedDataParallel

from ..model import ModelWrapper
from .base import Engine


@TrainingEngine.register("tango_fairscale::ddp")
class DDPEngine(Engine):
    """Torch ``DistributedDataParallel`` (a single process trains the bare model).

    Registered as a Tango ``TrainingEngine`` under the name ``"tango_fairscale::ddp"``. The baseline
    every sharded engine must reproduce. Fields: ``precision``, ``max_grad_norm`` (see
    :class:`~tango_fairscale.engines.base.Engine`) and ``optimizer`` / ``lr_scheduler`` as in Tango.

    Example (Jsonnet)::

        engine: {type: "tango_fairscale::ddp", precision: "bf16-mixed",
                 optimizer: {type: "torch::AdamW", lr: 1e-5}}
    """

    def _wrap_model(self, model: ModelWrapper) -> Model:
        model = model.to(self.device)
        if not self.train_config.is_distributed:
            return model
        device_ids = [self.device] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)  # type: ignore[return-value]
