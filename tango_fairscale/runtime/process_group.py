"""The job's process group: gloo on CPU, NCCL on GPUs, joined once per process."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from tango.integrations.torch import TrainConfig


def join_process_group(
    train_config: TrainConfig,
    timeout: timedelta | None = None,
    store: dist.Store | None = None,
) -> None:
    """Join the process group of ``train_config``'s job (a one-process group when it has one
    process: FSDP needs a group even alone); no-op when this process has joined one already.

    ``timeout`` bounds every collective (a rank that hangs makes the others fail instead of
    waiting forever); ``store`` is where the processes meet (a launcher's) instead of the
    config's address and port.
    """
    if dist.is_initialized():
        return
    device = train_config.worker_local_default_device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    rank, world_size = train_config.worker_id, train_config.world_size
    if store is None and not train_config.is_distributed:  # alone: meet in memory, not at a port
        store = dist.HashStore()
    if store is not None:
        dist.init_process_group(
            backend, store=store, world_size=world_size, rank=rank, timeout=timeout
        )
        return
    dist.init_process_group(
        backend,
        init_method=f"tcp://{train_config.distributed_address}:{train_config.distributed_port}",
        world_size=world_size,
        rank=rank,
        timeout=timeout,
    )


@contextlib.contextmanager
def hosted_store(train_config: TrainConfig) -> Iterator[None]:
    """Hold here, while the block runs, the store in which the processes this one spawns for
    ``train_config``'s job meet (:func:`spawned_store`). Its port is bound before they start, so
    no other program can take it meanwhile; ``distributed_port`` 0 binds a free one, and the
    config then holds the port bound."""
    store = dist.TCPStore(
        train_config.distributed_address,
        train_config.distributed_port,
        train_config.world_size,
        is_master=True,
        wait_for_workers=False,
    )
    train_config.distributed_port = store.port
    try:
        yield
    finally:
        del store


def spawned_store(train_config: TrainConfig, timeout: timedelta) -> dist.Store:
    """A spawned process's connection to the store its parent holds (:func:`hosted_store`)."""
    return dist.TCPStore(
        train_config.distributed_address,
        train_config.distributed_port,
        train_config.world_size,
        is_master=False,
        timeout=timeout,
    )


def leave_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alone() -> bool:
    """Whether this process has no other to agree with (no group, or a group of one). Collectives
    are skipped then: alone they change nothing, and the first one would start NCCL's
    communicator (seconds on a GPU, which FairScale alone never needs)."""
    return rank_and_world_size()[1] == 1


def barrier() -> None:
    if not alone():
        dist.barrier()


def rank_and_world_size() -> tuple[int, int]:
    """``(rank, world size)`` of this process's group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_gather_objects(value: Any) -> list[Any]:
    """``value`` of every rank, in rank order (``[value]`` without a process group); picklable
    values only. Call on every rank."""
    if alone():
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered
