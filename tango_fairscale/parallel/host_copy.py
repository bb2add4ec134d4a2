"""Copies of an engine's state in host memory, taken without waiting for the GPU: each device
tensor is copied on the current CUDA stream into a pinned buffer kept for the next copy of the
same shape, and an event says when the copies are complete (training goes on meanwhile: the
stream runs the copies before any later update of the tensors)."""

from __future__ import annotations

import copy
from typing import Any

import torch


class HostCopier:
    """Copies nested state (dicts, lists, tuples of tensors and plain data) into host memory,
    reusing its pinned buffers from one copy to the next. Tensors that share storage (tied
    weights) stay shared in the copy. A ``DTensor`` (FSDP2's shards) is copied as its local
    shard, wrapped in the same layout (as DCP's own staging does), so that DCP saves the copy as
    it would the original."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}

    def copy(self, state: Any) -> tuple[Any, torch.cuda.Event | None]:
        """``(copy of state, event)``: the event (``None`` without device tensors) completes when
        every device tensor's copy has; wait on it before reading the copy. The previous copy's
        buffers are reused: finish with a copy before taking the next."""
        self._used: set[tuple] = set()
        self._memo: dict[tuple, torch.Tensor] = {}
        self._on_device = False
        result = self._copy(state, ())
        self._buffers = {key: self._buffers[key] for key in self._used}
        event = None
        if self._on_device:
            event = torch.cuda.Event()
            event.record()
        return result, event

    def _copy(self, value: Any, path: tuple) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value.detach(), path)
        if isinstance(value, dict):
            return type(value)((key, self._copy(item, (*path, key))) for key, item in value.items())
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(self._copy(item, (*path, index)) for index, item in enumerate(value))
        return copy.deepcopy(value)

    def _tensor(self, tensor: torch.Tensor, path: tuple) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        if isinstance(tensor, DTensor):
            local = self._tensor(tensor.to_local(), path)
            return DTensor(local, tensor._spec, requires_grad=False)
        alias = (tensor.device, tensor.data_ptr(), tensor.dtype, tensor.shape, tensor.stride())
        if tensor.numel() and alias in self._memo:  # a tied weight: one copy, shared
            return self._memo[alias]
        if tensor.device.type != "cuda":
            copied = tensor.clone()
        else:
            buffer = self._buffers.get(path)
            if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
                buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
                self._buffers[path] = buffer
            self._used.add(path)
            copied = buffer.copy_(tensor, non_blocking=True)
            self._on_device = True
        self._memo[alias] = copied
        return copied
