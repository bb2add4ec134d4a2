"""Fixes for what the pinned stack gets wrong today, each applied once at import and guarded.

* Tango 1.3.2 records the git commit and ``origin`` remote of the working directory before each
  step and crashes (``ValueError``) in a repository with no commit or no ``origin`` remote — a
  fresh ``git init`` or a clone whose remote was renamed. Record no git metadata there instead.
  (``EnvironmentMetadata`` captured the method as its dataclass default factory, so the factory
  held by its ``__init__`` is replaced, not just the class attribute.)
* A config key a component does not take fails with Tango's "Extra parameters passed to X: {...}",
  which names neither the fields X takes nor the one meant: the closest field and the list are
  added (``difflib``), for every ``FromParams`` class and step (``patch_tango_unknown_fields``).
* An unregistered ``type`` (a typo) makes Tango import each of its integrations in search of the
  name; with the pinned transformers its ``transformers`` integration raises ``ImportError``, so a
  typo surfaced as a raw import error. Integrations that do not import are skipped, and the typo
  ends in Tango's ``RegistryKeyError`` ("... is not a registered name ..., did you mean ...?").
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
from collections.abc import Iterator
from typing import Any


def patch_tango_git_metadata() -> None:
    from tango.step_info import EnvironmentMetadata, GitMetadata

    original = GitMetadata.check_for_repo

    def check_for_repo() -> GitMetadata | None:
        try:
            return original()
        except ValueError:  # no commit yet, or no "origin" remote
            return None

    cells: Any = EnvironmentMetadata.__init__.__closure__ or ()
    for cell in cells:
        if cell.cell_contents == original:
            cell.cell_contents = check_for_repo


def _subclasses(cls: type) -> Iterator[type]:
    subclass: type
    for subclass in cls.__subclasses__():
        yield subclass
        yield from _subclasses(subclass)


def accepted_fields(class_name: str) -> list[str]:
    """The config keys that the ``FromParams`` classes named ``class_name`` take (for a step: its
    ``run`` arguments, then Tango's ``step_*`` options)."""
    from tango import Step
    from tango.common import FromParams

    fields: list[str] = []
    for cls in _subclasses(FromParams):
        if cls.__name__ != class_name:
            continue
        functions = [cls.run, Step.__init__] if issubclass(cls, Step) else [cls.__init__]
        for function in functions:
            try:
                parameters = inspect.signature(function).parameters.values()
            except (TypeError, ValueError):
                continue
            fields += [
                p.name
                for p in parameters
                if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                and p.name not in ("self", "train_config", "step_config", "step_unique_id_override")
                and p.name not in fields
            ]
    return fields


def patch_tango_unknown_fields() -> None:
    from tango.common.exceptions import ConfigurationError
    from tango.common.params import Params

    original = Params.assert_empty
    if getattr(original, "suggests_fields", False):
        return

    def assert_empty(self: Params, name: str) -> None:
        try:
            original(self, name)
        except ConfigurationError as error:
            fields = accepted_fields(name)
            if not fields:
                raise
            guesses = [
                f"{close[0]!r} for {key!r}"
                for key in self.params
                if (close := difflib.get_close_matches(str(key), fields, n=1, cutoff=0.6))
            ]
            hint = f"; did you mean {', '.join(guesses)}?" if guesses else ""
            raise ConfigurationError(f"{error}{hint} ({name} takes {', '.join(fields)})") from None

    assert_empty.suggests_fields = True  # type: ignore[attr-defined]
    Params.assert_empty = assert_empty  # type: ignore[method-assign]


def patch_tango_registry_search() -> None:
    import tango.common.registrable as registrable
    from tango.common.exceptions import IntegrationMissingError

    original = registrable.import_module_and_submodules
    if getattr(original, "skips_broken_integrations", False):
        return

    broken: set[str] = set()  # imported half-way once: importing again re-registers names

    def import_module_and_submodules(module: str, *args: Any, **kwargs: Any) -> None:
        if module in broken:
            raise IntegrationMissingError(module.rsplit(".", 1)[-1])
        try:
            original(module, *args, **kwargs)
        except ImportError as error:
            if not module.startswith("tango.integrations."):
                raise
            broken.add(module)
            raise IntegrationMissingError(module.rsplit(".", 1)[-1]) from error

    import_module_and_submodules.skips_broken_integrations = True  # type: ignore[attr-defined]
    registrable.import_module_and_submodules = import_module_and_submodules  # type: ignore[assignment]


def apply() -> None:
    patch_tango_git_metadata()
    patch_tango_unknown_fields()
    patch_tango_registry_search()


# --- FairScale 0.4.13 on current torch -----------------------------------------------------------
#
# FairScale's FSDP was written for CUDA. On CPU processes (gloo) it fails in four places, fixed here
# and each covered by a test that fails without its fix (tests/test_compat.py):
#
# 1. It drives CUDA streams unconditionally (``self._streams["all_gather"]`` -> ``KeyError`` when
#    none were made; ``torch.cuda.current_stream()``). Its module sees a ``torch`` whose ``cuda``
#    namespace hands out no-op streams when CUDA is absent.
# 2. ``Tensor.record_stream`` with such a stream: ignored (CPU memory needs no stream bookkeeping).
# 3. gloo rejects the flat 2-D reduce-scatter / all-gather "base" collectives: the list-based
#    collectives are used on gloo (FairScale's own ``ENABLE_NCCL_BASE_COLLECTIVES=0`` switch).
# 4. CPU offload pins host memory, which needs a GPU: on a machine without one, nothing is pinned.
#
# Three more are handled in how the FairScale engine uses FSDP:
#
# 5. ``clip_grad_norm_`` calls ``.cuda()``: :func:`clip_grad_norm_` takes the norm over all shards.
# 6. At world size 1 no reduce-scatter runs, and mixed precision leaves the gradients in the compute
#    dtype, which the fp32 optimizer rejects — unless ``fp32_reduce_scatter=True``, which casts
#    them first: the engine always sets it with mixed precision (fp32 reduction is wanted anyway).
# 7. ``load_local_state_dict`` on a nested model that never ran a forward fails
#    (``'_full_param_padded'``): :func:`load_local_state_dict` initialises it first.

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
        import contextlib

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


# --- transformers 5 ----------------------------------------------------------------------------
#
# 8. Without an attention mask, transformers 5 looks for packed sequences in every forward
#    (``masking_utils.find_packed_sequence_indices``: ``(mask[:, -1] == 0).all()`` read on the
#    host), which makes the CPU wait for the GPU once per forward and leaves the GPU idle while
#    Python launches the rest of it. :class:`~tango_fairscale.model.ModelWrapper` calls it
#    without a mask only for right-padded batches (one sequence per row, positions from 0; packed
#    batches come with their own mask), so :func:`unpacked_sequences` answers "not packed"
#    without looking, for the duration of that call.


@contextlib.contextmanager
def unpacked_sequences() -> Iterator[None]:
    """Within the block, transformers treats every row as one sequence (fix 8)."""
    from transformers import masking_utils

    detect = getattr(masking_utils, "find_packed_sequence_indices", None)
    if detect is None:  # another transformers: nothing to skip
        yield
        return
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = detect
