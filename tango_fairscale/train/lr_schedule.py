"""The learning-rate schedule of fine-tuning runs: linear warmup, then constant, linear or cosine
decay to zero at the last step."""

from __future__ import annotations

import math
from typing import Any

import torch
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import LRScheduler

from .. import compat  # noqa: F401  (Tango fixes)
from ..checks import non_negative_int, one_of, positive_int

DECAYS = ("constant", "linear", "cosine")


@LRScheduler.register("tango_fairscale::warmup")
class WarmupSchedule(torch.optim.lr_scheduler.LambdaLR):
    """The optimizer's learning rate times a factor that rises linearly from ``1 / (warmup_steps
    + 1)`` to 1 over the first ``warmup_steps`` steps, then stays (``constant``) or falls to 0 at
    ``train_steps`` (``linear``, ``cosine``).

    Registered as a Tango ``LRScheduler`` under the name ``"tango_fairscale::warmup"``. The
    training step logs the learning rate each step used.

    Example (Jsonnet)::

        lr_scheduler: {type: "tango_fairscale::warmup", warmup_steps: 100, train_steps: 2000,
                       decay: "linear"}
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_steps: int = 0,
        train_steps: int | None = None,
        decay: str = "constant",
        **kwargs: Any,
    ) -> None:
        self.check_settings(warmup_steps, train_steps, decay)
        self.warmup_steps = warmup_steps
        self.train_steps = train_steps
        self.decay = decay
        super().__init__(optimizer, self.factor, **kwargs)

    @classmethod
    def check_config(cls, fields: dict[str, Any]) -> None:
        """Refuse in one line the schedule block ``fields`` (as written) that building it would
        refuse: the training step checks it before any step runs."""
        warmup_steps, decay = fields.get("warmup_steps", 0), fields.get("decay", "constant")
        cls.check_settings(warmup_steps, fields.get("train_steps"), decay)

    @staticmethod
    def check_settings(warmup_steps: Any, train_steps: Any, decay: Any) -> None:
        non_negative_int("warmup_steps", warmup_steps)
        one_of("decay", decay, DECAYS)
        if decay != "constant":
            positive_int("train_steps", train_steps)
            if train_steps <= warmup_steps:
                raise ConfigurationError(
                    f"train_steps {train_steps} leaves no steps to decay over after "
                    f"warmup_steps {warmup_steps}; lower warmup_steps or use decay 'constant'"
                )

    def factor(self, step: int) -> float:
        """The learning-rate factor of (0-based) step ``step``."""
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        if self.decay == "constant":
            return 1.0
        assert self.train_steps is not None
        progress = min(1.0, (step - self.warmup_steps) / (self.train_steps - self.warmup_steps))
        if self.decay == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))
