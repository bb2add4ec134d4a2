"""FairScale 0.4.13's FSDP on current torch, and on CPU processes (gloo), where it was never run.

Four fixes are patches, applied by :func:`patch_fairscale_for_cpu` and
:func:`use_list_collectives_for_gloo`, each covered by a test that fails without it
(``tests/integration/compat/test_fairscale_fixes.py``):

1. It drives CUDA streams unconditionally (``self._streams["all_gather"]`` -> ``KeyError`` when
   none were made; ``torch.cuda.current_stream()``). Its module sees a ``torch`` whose ``cuda``
   namespace hands out no-op streams when CUDA is absent.
2. ``Tensor.record_stream`` with such a stream: ignored (CPU memory needs no stream bookkeeping).
3. gloo rejects the flat 2-D reduce-scatter / all-gather "base" collectives: the list-based
   collectives are used on gloo (FairScale's own ``ENABLE_NCCL_BASE_COLLECTIVES=0`` switch).
4. CPU offload pins host memory, which needs a GPU: on a machine without one, nothing is pinned.

Three more are handled in how the FairScale engine uses FSDP:

5. ``clip_grad_norm_`` calls ``.cuda()``: :func:`clip_grad_norm_` takes the norm over all shards.
6. At world size 1 no reduce-scatter runs, and mixed precision leaves the gradients in the compute
   dtype, which the fp32 optimizer rejects — unless ``fp32_reduce_scatter=True``, which casts
   them first: the engine always sets it with mixed precision (fp32 reduction is wanted anyway).
7. ``load_local_state_dict`` on a nested model that never ran a forward fails
   (``'_full_param_padded'``): :func:`load_local_state_dict` initialises it first.

And one for the terminal: it frees and re-allocates its flat parameters through
``Tensor.storage()``, which current torch deprecates with a ``UserWarning`` ("TypedStorage is
deprecated") on every rank of every run; the pinned FairScale keeps doing so and nothing is
for a user to change, so :func:`quiet_storage_deprecation` leaves that warning out where
FairScale's code makes the call (a filter on FairScale's modules alone).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

FAIRSCALE_VERSION = "0.4.13"


class _NullStream:
    """Stands in for a CUDA stream where there is none: every operation is a no-op.

    All null streams are the same stream (FairScale asserts which stream is current).
    """

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NullStream)

    def __hash__(self) -> int:
        return 0

    def wait_stream(self, stream: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _CudaWithoutGPU:
    """The parts of ``torch.cuda`` that FairScale's FSDP uses, for processes without a GPU."""

    Stream = _NullStream

    @staticmethod
    def is_available() -> bool:
        return True  # make FSDP create its (null) streams instead of skipping them half-way

    @staticmethod
    def current_stream(device: Any = None) -> _NullStream:
        return _NullStream()

    @staticmethod
    def stream(stream: Any) -> Any:

        return contextlib.nullcontext()

    @staticmethod
    def synchronize(device: Any = None) -> None:
        pass

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    max_memory_allocated = memory_allocated


class _TorchWithoutGPU:
    """``torch`` as FairScale's FSDP module sees it on a machine without a GPU."""

    cuda = _CudaWithoutGPU()

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch, name)


def patch_fairscale_for_cpu() -> None:
    """Let FairScale 0.4.13's FSDP run in CPU processes (no-op on a machine with a GPU)."""
    import torch

    if torch.cuda.is_available():
        return
    import fairscale

    if fairscale.__version__ != FAIRSCALE_VERSION:
        raise RuntimeError(
            f"tango_fairscale's FairScale fixes were written for fairscale=={FAIRSCALE_VERSION}, "
            f"found {fairscale.__version__}; install the pinned version (constraints.txt)"
        )
    use_null_streams()
    skip_pinned_memory()


def quiet_storage_deprecation() -> None:
    """No "TypedStorage is deprecated" warning for FairScale's own ``Tensor.storage()`` calls."""
    warnings.filterwarnings(
        "ignore", message="TypedStorage is deprecated", category=UserWarning, module=r"fairscale\."
    )


def use_null_streams() -> None:
    """Fixes 1 and 2: FairScale's FSDP module sees no-op CUDA streams."""
    import torch
    from fairscale.nn.data_parallel import fully_sharded_data_parallel as fsdp_module

    if isinstance(fsdp_module.torch, _TorchWithoutGPU):
        return
    fsdp_module.torch = _TorchWithoutGPU()  # type: ignore[assignment]
    record_stream = torch.Tensor.record_stream

    def record_stream_or_skip(tensor: torch.Tensor, stream: Any) -> None:
        if not isinstance(stream, _NullStream):
            record_stream(tensor, stream)

    torch.Tensor.record_stream = record_stream_or_skip  # type: ignore[method-assign,assignment]


def skip_pinned_memory() -> None:
    """Fix 4: FSDP's parameter set-up pins nothing (pinning needs a GPU)."""
    import torch
    from fairscale.nn.data_parallel import FullyShardedDataParallel

    init_param_attributes = FullyShardedDataParallel._init_param_attributes
    if getattr(init_param_attributes, "_unpinned", False):
        return

    def init_param_attributes_unpinned(self: Any, p: Any) -> None:
        pin_memory = torch.Tensor.pin_memory
        torch.Tensor.pin_memory = lambda t, *args, **kwargs: t  # type: ignore[method-assign]
        try:
            init_param_attributes(self, p)
        finally:
            torch.Tensor.pin_memory = pin_memory  # type: ignore[method-assign]

    init_param_attributes_unpinned._unpinned = True  # type: ignore[attr-defined]
    FullyShardedDataParallel._init_param_attributes = init_param_attributes_unpinned  # type: ignore[method-assign]


def use_list_collectives_for_gloo() -> None:
    """Fix 3: gloo has no flat "base" all-gather / reduce-scatter: use FairScale's list versions."""
    from fairscale.internal import reduce_scatter_bucketer
    from fairscale.nn.data_parallel import fully_sharded_data_parallel as fsdp_module

    fsdp_module.enable_nccl_base_collectives = False  # type: ignore[attr-defined]
    reduce_scatter_bucketer.enable_nccl_base_collectives = False  # type: ignore[attr-defined]


def clip_grad_norm_(model: Any, max_norm: float) -> Any:
    """Fix 5: scale all gradients so that their norm over every rank's shards is at most
    ``max_norm``; returns that total norm. Call on every rank."""
    import torch
    import torch.distributed as dist

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    squares = torch.stack([g.detach().float().pow(2).sum() for g in grads]).sum()
    if dist.get_world_size() > 1:  # alone, NCCL's communicator is never started
        dist.all_reduce(squares)
    total_norm = squares.sqrt()
    scale = (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
    for grad in grads:
        grad.mul_(scale.to(grad.device, grad.dtype))
    return total_norm


def load_local_state_dict(model: Any, state: dict) -> None:
    """Fix 7: load this rank's shards into a (possibly never run) nested FSDP model."""
    from fairscale.nn.data_parallel.fully_sharded_data_parallel import get_fsdp_instances

    for instance in get_fsdp_instances(model):  # the root first: it tells the others they are not
        instance._lazy_init()
    model.load_local_state_dict(state)
