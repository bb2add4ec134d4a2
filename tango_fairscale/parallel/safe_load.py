"""Reading checkpoint files without running code: torch files through torch's weights-only
unpickler, ``torch.distributed.checkpoint`` metadata through an exact allow-list.

A checkpoint is data someone may hand over (a shared run, a downloaded directory); a pickle can
name any importable callable, and plain ``pickle`` calls what it names. ``torch.distributed.
checkpoint`` reads its ``.metadata`` with plain ``pickle`` and its non-tensor entries (an
optimizer's ``param_groups``) with ``torch.load(weights_only=False)``; :mod:`.dcp_storage`'s
reader and planner replace both reads with this module's. An allow-list here holds exact
``(module, name)`` pairs mapped to the objects they stand for: no name is looked up in a module
(so no dotted name ``os.system`` under an allowed module resolves), nothing is imported.
"""

from __future__ import annotations

import functools
import io
import pathlib
import pickle
from pathlib import Path
from typing import Any

import torch

# torch.distributed.checkpoint is imported where a DCP metadata file is read: it imports DTensor
# and sympy (~0.8 s), which a ``tango run`` that reads none (every step cached) does not pay.

__all__ = ["check_dcp_metadata", "load_torch_file"]


def load_torch_file(path: Path, mmap: bool = False) -> Any:
    """``torch.load`` of a file the package wrote (a rank file, trainer state, final weights),
    through torch's weights-only unpickler: tensors and plain containers only, on the CPU."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


@functools.cache
def dcp_metadata_globals() -> dict[tuple[str, str], Any]:
    """Every global a DCP ``.metadata`` pickle names, as ``(module, name)`` → the object."""
    from torch.distributed.checkpoint import filesystem as dcp_filesystem
    from torch.distributed.checkpoint import metadata as dcp_metadata

    metadata_module = dcp_metadata.__name__
    allowed: dict[tuple[str, str], Any] = {
        (metadata_module, name): getattr(dcp_metadata, name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        )
    }
    allowed[(dcp_filesystem.__name__, "_StorageInfo")] = dcp_filesystem._StorageInfo
    allowed[("torch", "Size")] = torch.Size
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
    allowed[("pathlib", "PosixPath")] = pathlib.PurePosixPath  # a path object, never a file read
    allowed[("pathlib", "PurePosixPath")] = pathlib.PurePosixPath
    allowed[("collections", "OrderedDict")] = dict
    for name, value in vars(torch).items():  # dtypes are pickled as attributes of torch
        if isinstance(value, torch.dtype):
            allowed[("torch", name)] = value
    return allowed


class _AllowListUnpickler(pickle.Unpickler):
    """Resolves a global only through ``allowed``, an exact ``(module, name)`` → object map."""

    def __init__(self, file: Any, allowed: dict[tuple[str, str], Any], what: str) -> None:
        super().__init__(file)
        self._allowed = allowed
        self._what = what

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except (KeyError, TypeError):
            raise pickle.UnpicklingError(f"{module}.{name} is not part of {self._what}") from None


def read_dcp_metadata(data: bytes) -> Any:
    """A DCP ``.metadata`` file's content unpickled through the allow-list; raises
    ``pickle.UnpicklingError`` naming the first global it refuses."""
    unpickler = _AllowListUnpickler(
        io.BytesIO(data), dcp_metadata_globals(), "a distributed checkpoint's metadata"
    )
    return unpickler.load()


def check_dcp_metadata(path: Path) -> None:
    """Refuse (``pickle.UnpicklingError``) a ``.metadata`` file that names a global outside the
    allow-list."""
    read_dcp_metadata(Path(path).read_bytes())
