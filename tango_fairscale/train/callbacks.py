"""Tango's ``TrainCallback`` s in the package's training loop: built on every rank and called with
the hooks ``torch::train`` calls, so that ``wandb::log`` and users' own callbacks work."""

from __future__ import annotations

from typing import Any

from tango.common import Lazy
from tango.common.dataset_dict import DatasetDict
from tango.integrations.torch import TrainCallback, TrainConfig, TrainingEngine


class Callbacks:
    """The run's callbacks; :meth:`call` runs a hook on each, in order.

    As under ``torch::train``, every rank builds and calls them (``wandb::log`` gathers peak
    memory from all ranks; callbacks that log check ``is_local_main_process``). They receive the
    training pairs as ``dataset_dict`` (split ``train``: ``{"context", "continuation"}``) and no
    data loaders (the loop batches by a schedule of its own). ``post_batch`` gets the step's
    loss as a float, which waits for the device once a step (only when there are callbacks).
    """

    def __init__(
        self,
        lazy_callbacks: list[Lazy[TrainCallback]],
        *,
        workspace: Any,
        train_config: TrainConfig,
        engine: TrainingEngine,
        training_pairs: list[tuple[str, str]],
    ) -> None:
        documents = [{"context": c, "continuation": x} for c, x in training_pairs]
        self.callbacks = [
            callback.construct(
                workspace=workspace,
                train_config=train_config,
                training_engine=engine,
                dataset_dict=DatasetDict(splits={"train": documents}),
                train_dataloader=None,
                validation_dataloader=None,
            )
            for callback in lazy_callbacks
        ]

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def call(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(*args)

    def state_dict(self) -> list[dict[str, Any]]:
        return [callback.state_dict() for callback in self.callbacks]

    def load_state_dict(self, states: list[dict[str, Any]]) -> None:
        for callback, state in zip(self.callbacks, states, strict=True):
            callback.load_state_dict(state)
