"""Copies of an engine's state in host memory, taken without waiting for the GPU: every device
tensor is copied on the current CUDA stream into one block of pinned host memory, kept for the
next copy, and an event says when the copies are complete (training goes on meanwhile: the stream
runs the copies before any later update of the tensors)."""

from __future__ import annotations

import copy
import dataclasses
import logging
import weakref
from collections.abc import Iterator
from typing import Any

import torch

logger = logging.getLogger(__name__)

#: Where each tensor's copy starts in the block: a multiple of this many bytes.
ALIGNMENT = 64


class CopiesDone:
    """When a copy's device-to-host copies are complete: one CUDA event per device it copied
    from (an engine may hold state on several: the pipe engine's stages), each recorded on that
    device's current stream."""

    def __init__(self, devices: set[torch.device]) -> None:
        self.events = []
        for device in devices:
            with torch.cuda.device(device):
                event = torch.cuda.Event()
                event.record()
                self.events.append(event)

    def synchronize(self) -> None:
        """Wait for every copy."""
        for event in self.events:
            event.synchronize()


class HostCopier:
    """Copies nested state (dicts, lists, tuples and dataclasses of tensors and plain data) into
    host memory.
    Tensors on ``device_type`` (CUDA unless a test says otherwise) are copied into one block of
    host memory, pinned for CUDA, that the next copy reuses, each copy a storage of its own over
    its bytes of the block: allocated once, at its exact size (:meth:`reserve` allocates it ahead,
    e.g. on a thread while training goes on), where one pinned allocation per tensor would round
    each up to a power of two and a first checkpoint of billions of parameters would stop the loop
    to pin them one by one. Other tensors are cloned. Tensors that share storage (tied weights)
    stay shared in the copy. A ``DTensor`` (FSDP2's shards) is copied as its local shard, wrapped
    in the same layout (as DCP's own staging does), so that DCP saves the copy as it would the
    original."""

    def __init__(self, device_type: str = "cuda") -> None:
        self.device_type = device_type
        self._block: torch.Tensor | None = None
        self._bytes: Any = None  # the block as a NumPy array: slices that own no storage
        self._memo: dict[tuple, torch.Tensor] = {}  # the last copy's tensors, by alias

    def size(self, state: Any) -> int:
        """The bytes of the block that a copy of ``state`` takes."""
        return self._layout(state)[1]

    def reserve(self, nbytes: int) -> None:
        """Make the block hold at least ``nbytes``: a new block (the old one freed) only when it
        is smaller. Finish with the previous copy before (as for :meth:`copy`)."""
        if nbytes and (self._block is None or self._block.numel() < nbytes):
            self.release()
            self._block = _host_block(nbytes, pin=self.device_type == "cuda")
            self._bytes = self._block.numpy()

    def release(self) -> None:
        """Give the block up: unpinned now, its memory freed once no copy taken from it is alive
        any more (a copy handed on keeps its bytes); the next copy allocates another."""
        self._block = self._bytes = None
        self._memo = {}

    def copy(self, state: Any) -> tuple[Any, CopiesDone | None]:
        """``(copy of state, done)``: ``done`` (``None`` without CUDA tensors) completes when
        every device tensor's copy has; wait on it before reading the copy. The previous copy's
        block is reused: finish with a copy before taking the next."""
        self._starts, nbytes = self._layout(state)
        self.reserve(nbytes)
        self._memo = {}
        result = self._copy(state)
        done = None
        if nbytes and self.device_type == "cuda":
            done = CopiesDone({alias[0] for alias in self._starts})  # the staged tensors' devices
        return result, done

    def _layout(self, state: Any) -> tuple[dict[tuple, int], int]:
        """Where each staged tensor of ``state`` (by :func:`_alias`) starts in the block, and
        the bytes they take."""
        starts: dict[tuple, int] = {}
        end = 0
        for tensor in _tensors(state):
            alias = _alias(tensor)
            if _staged(tensor, self.device_type) and alias not in starts:
                starts[alias] = -(-end // ALIGNMENT) * ALIGNMENT
                end = starts[alias] + _nbytes(tensor)
        return starts, end

    def _copy(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value.detach())
        if isinstance(value, dict):
            return type(value)((key, self._copy(item)) for key, item in value.items())
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(self._copy(item) for item in value)
        if _is_dataclass(value):  # a format's snapshot (DCP's): its fields copied as the rest
            fields = {field.name: getattr(value, field.name) for field in _fields(value)}
            return dataclasses.replace(value, **self._copy(fields))
        return copy.deepcopy(value)

    def _tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        if isinstance(tensor, DTensor):
            local = self._tensor(tensor.to_local())
            return DTensor(local, tensor._spec, requires_grad=False)
        alias = _alias(tensor)
        if tensor.numel() and alias in self._memo:  # a tied weight: one copy, shared
            return self._memo[alias]
        if not _staged(tensor, self.device_type):
            copied = tensor.clone()
        else:
            start = self._starts[alias]
            # A storage of its own over these bytes of the block (not a view of the block's
            # storage, which torch.save and DCP would write whole with every tensor).
            part = torch.from_numpy(self._bytes[start : start + _nbytes(tensor)])
            copied = part.view(tensor.dtype).view(tensor.shape).copy_(tensor, non_blocking=True)
        self._memo[alias] = copied
        return copied


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors of nested state in the order :meth:`HostCopier.copy` meets them (a
    ``DTensor`` as its local shard)."""
    if isinstance(value, torch.Tensor):
        from torch.distributed.tensor import DTensor

        yield value.to_local() if isinstance(value, DTensor) else value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        for item in value:
            yield from _tensors(item)
    elif _is_dataclass(value):
        for field in _fields(value):
            yield from _tensors(getattr(value, field.name))


def _is_dataclass(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _fields(value: Any) -> list[dataclasses.Field]:
    """The fields of a dataclass instance that its constructor takes."""
    return [field for field in dataclasses.fields(value) if field.init]


def _staged(tensor: torch.Tensor, device_type: str) -> bool:
    """Whether ``tensor``'s copy goes to the block (empty tensors are cloned, wherever)."""
    return tensor.device.type == device_type and tensor.numel() > 0


def _alias(tensor: torch.Tensor) -> tuple:
    """What makes two tensors one (tied weights): the same memory seen the same way (for
    tensors that are not empty: an empty one's pointer says nothing)."""
    return (tensor.device, tensor.data_ptr(), tensor.dtype, tensor.shape, tensor.stride())


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _host_block(nbytes: int, pin: bool) -> torch.Tensor:
    """``nbytes`` of host memory, every page touched (by torch's threads) and, with ``pin``,
    registered with CUDA as pinned at its exact size; unpinned when the block is freed. Memory
    that cannot be pinned stays pageable (copies into it wait for the GPU), with a warning."""
    block = torch.empty(nbytes, dtype=torch.uint8)
    block.zero_()  # touch the pages in parallel: registering would fault them in one by one
    if pin:
        cudart = torch.cuda.cudart()
        failed = int(cudart.cudaHostRegister(block.data_ptr(), nbytes, 0))
        if failed:
            logger.warning(
                "could not pin %.1f GB of host memory for checkpoints (CUDA error %d): "
                "each checkpoint's copy waits for the GPU",
                nbytes / 1e9,
                failed,
            )
        else:
            weakref.finalize(block, cudart.cudaHostUnregister, block.data_ptr())
    return block
