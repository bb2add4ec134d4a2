"""The optimizer's update inside the backward: parameters stepped, and their gradients freed, as
soon as the backward has summed those gradients, so that no step holds every gradient at once.

Where it applies (:meth:`BackwardStep.applies`): a fused Adam or AdamW, no gradient clipping (it
needs every gradient before any update), one micro-batch a step (accumulation needs the summed
gradients). Finished gradients wait in a bucket of :data:`BUCKET_BYTES`; a full bucket (and the
last one, at :meth:`BackwardStep.flush`) is updated by the optimizer's own ``step()`` over those
parameters alone. A fused update computes each element alike whatever tensors it is given with,
so the trained weights are those of one step over all parameters after the backward. Used by
the CUDA-graphed steps (:mod:`.graphs`), whose graphs then hold the updates too: GPT-2 124M
never holds all of its 0.46 GiB of fp32 gradients at once (``docs/PERFORMANCE.md``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

#: Gradients held before their parameters are updated together: one fused launch per bucket
#: (per parameter, GPT-2 124M's 148 launches took ~0.4 ms of a 12 ms step).
BUCKET_BYTES = 32 << 20


class BackwardStep:
    """Post-accumulate-grad hooks on ``optimizer``'s parameters that, while :meth:`stepping`,
    update parameters a bucket at a time once their gradients are complete, then drop the
    gradients; while :meth:`dropping`, only drop them (passes whose gradients are thrown away);
    otherwise do nothing (the usual step after the backward)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        # Group indices, not the groups: loading a state dict replaces the group dicts.
        self._group_index = {
            parameter: index
            for index, group in enumerate(optimizer.param_groups)
            for parameter in group["params"]
        }
        self._mode = "off"
        self._bucket: list[torch.Tensor] = []
        self._bucket_bytes = 0
        #: While a graph captures: each group's learning rate as a device tensor the graph reads
        #: (:meth:`fill_learning_rates` before each replay), not the float it would bake in.
        self._lr_tensors: list[torch.Tensor] | None = None
        for parameter in self._group_index:
            if parameter.requires_grad:
                parameter.register_post_accumulate_grad_hook(self._hook)

    @staticmethod
    def applies(
        optimizer: torch.optim.Optimizer, clips: bool, grad_accum: int, scheduler: Any = None
    ) -> bool:
        """Whether updates inside the backward train as the step after it does: a fused Adam
        or AdamW (which takes a device tensor as its learning rate), no clipping, no
        accumulation, and a ``scheduler`` that moves only the learning rate (a graph holds the
        other settings: ``OneCycleLR``'s or ``CyclicLR``'s ``cycle_momentum`` would call for
        new graphs every step)."""
        adam = isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW))
        fused = all(group.get("fused") for group in optimizer.param_groups)
        fixed = not getattr(scheduler, "cycle_momentum", False)
        return adam and fused and not clips and grad_accum == 1 and fixed

    @contextlib.contextmanager
    def stepping(self, lr_tensors: bool = False) -> Iterator[None]:
        """Update parameters in the backward. The caller calls :meth:`flush` after it (inside a
        graph's capture: the last bucket's update is part of the graph); ``lr_tensors``: read
        the learning rates from device tensors (a graph being captured)."""
        if lr_tensors and self._lr_tensors is None:
            device = next(iter(self._group_index)).device
            self._lr_tensors = [
                torch.tensor(float(group["lr"]), device=device)
                for group in self.optimizer.param_groups
            ]
        with self._in_mode("capture" if lr_tensors else "step"):
            yield
            if self._bucket:
                raise RuntimeError("BackwardStep.stepping: the last bucket was not flushed")

    def flush(self) -> None:
        """Update the parameters whose gradients wait in the bucket (after the backward)."""
        if self._bucket:
            self._update(self._bucket)
            for parameter in self._bucket:
                parameter.grad = None
            self._bucket, self._bucket_bytes = [], 0

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
            self._bucket, self._bucket_bytes = [], 0

    def _hook(self, parameter: torch.Tensor) -> None:
        if self._mode == "drop":
            parameter.grad = None
        elif self._mode != "off":
            assert parameter.grad is not None
            self._bucket.append(parameter)
            self._bucket_bytes += parameter.grad.numel() * parameter.grad.element_size()
            if self._bucket_bytes >= BUCKET_BYTES:
                self.flush()

    def _update(self, parameters: list[torch.Tensor]) -> None:
        """The optimizer's own step over ``parameters`` alone (each with its group's settings).
        A graph being captured must not make optimizer state (its memory would be the graph's):
        a parameter without any is refused, and the step then runs eagerly."""
        if self._mode == "capture" and not all(self.optimizer.state.get(p) for p in parameters):
            raise RuntimeError("a parameter's first update cannot be captured (no optimizer state)")
        groups = self.optimizer.param_groups
        alone = []
        for index, group in enumerate(groups):
            members = [p for p in parameters if self._group_index[p] == index]
            if members:
                alone.append({**group, "params": members})
                if self._mode == "capture":
                    assert self._lr_tensors is not None
                    alone[-1] |= {"lr": self._lr_tensors[index], "capturable": True}
        self.optimizer.param_groups = alone
        try:
            self.optimizer.step()
        finally:
            self.optimizer.param_groups = groups
