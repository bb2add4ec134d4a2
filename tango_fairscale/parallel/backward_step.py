"""The optimizer's update inside the backward: each parameter stepped, and its gradient freed, as
soon as the backward has summed that gradient, so that no step holds every gradient at once.

Where it applies (:meth:`BackwardStep.applies`): a fused Adam or AdamW, no gradient clipping (it
needs every gradient before any update), one micro-batch a step (accumulation needs the summed
gradients). Each parameter's update is the optimizer's own ``step()`` over that parameter alone;
a fused update computes each element alike whatever tensors it is given with, so the trained
weights are those of one step over all parameters after the backward. Used by the CUDA-graphed
steps (:mod:`.graphs`), whose graphs then hold the updates too: GPT-2 124M frees its 0.46 GiB of
fp32 gradients (``docs/PERFORMANCE.md``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


class BackwardStep:
    """Post-accumulate-grad hooks on ``optimizer``'s parameters that, while :meth:`stepping`,
    update each parameter once its gradient is complete and then drop the gradient; while
    :meth:`dropping`, only drop it (passes whose gradients are thrown away); otherwise do
    nothing (the usual step after the backward)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        # Group indices, not the groups: loading a state dict replaces the group dicts.
        self._group_index = {
            parameter: index
            for index, group in enumerate(optimizer.param_groups)
            for parameter in group["params"]
        }
        self._mode = "off"
        #: While a graph captures: each group's learning rate as a device tensor the graph reads
        #: (:meth:`fill_learning_rates` before each replay), not the float it would bake in.
        self._lr_tensors: list[torch.Tensor] | None = None
        for parameter in self._group_index:
            if parameter.requires_grad:
                parameter.register_post_accumulate_grad_hook(self._hook)

    @staticmethod
    def applies(optimizer: torch.optim.Optimizer, clips: bool, grad_accum: int) -> bool:
        """Whether updates inside the backward train as the step after it does: a fused Adam
        or AdamW (which takes a device tensor as its learning rate), no clipping, no
        accumulation."""
        adam = isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW))
        fused = all(group.get("fused") for group in optimizer.param_groups)
        return adam and fused and not clips and grad_accum == 1

    def has_state(self) -> bool:
        """Whether every parameter has its optimizer state (made by its first update, outside
        any graph: a graph must not allocate it)."""
        return all(self.optimizer.state.get(parameter) for parameter in self._group_index)

    @contextlib.contextmanager
    def stepping(self, lr_tensors: bool = False) -> Iterator[None]:
        """Update each parameter in the backward; ``lr_tensors``: read the learning rates from
        device tensors (a graph being captured)."""
        if lr_tensors and self._lr_tensors is None:
            device = next(iter(self._group_index)).device
            self._lr_tensors = [
                torch.tensor(float(group["lr"]), device=device)
                for group in self.optimizer.param_groups
            ]
        with self._in_mode("step" if not lr_tensors else "capture"):
            yield

    @contextlib.contextmanager
    def dropping(self) -> Iterator[None]:
        """Drop each gradient in the backward, updating nothing."""
        with self._in_mode("drop"):
            yield

    def fill_learning_rates(self) -> None:
        """Copy each group's current learning rate (the scheduler's) into the tensor a captured
        graph reads: before each replay."""
        for lr, group in zip(self._lr_tensors or [], self.optimizer.param_groups, strict=False):
            lr.fill_(float(group["lr"]))

    def hyperparameters(self) -> list[dict[str, Any]]:
        """Each group's settings other than its parameters and learning rate: what a captured
        update holds fixed (a change calls for new graphs)."""
        return [
            {key: value for key, value in group.items() if key not in ("params", "lr")}
            for group in self.optimizer.param_groups
        ]

    @contextlib.contextmanager
    def _in_mode(self, mode: str) -> Iterator[None]:
        self._mode = mode
        try:
            yield
        finally:
            self._mode = "off"

    def _hook(self, parameter: torch.Tensor) -> None:
        if self._mode in ("step", "capture"):
            self._update(parameter)
        if self._mode != "off":
            parameter.grad = None

    def _update(self, parameter: torch.Tensor) -> None:
        """The optimizer's own step over ``parameter`` alone (its group's settings)."""
        index = self._group_index[parameter]
        alone = {**self.optimizer.param_groups[index], "params": [parameter]}
        if self._mode == "capture":
            assert self._lr_tensors is not None
            alone |= {"lr": self._lr_tensors[index], "capturable": True}
        groups = self.optimizer.param_groups
        self.optimizer.param_groups = [alone]
        try:
            self.optimizer.step()
        finally:
            self.optimizer.param_groups = groups
