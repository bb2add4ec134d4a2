"""Reading checkpoint files without running code: torch files through torch's weights-only
unpickler, ``torch.distributed.checkpoint`` metadata and byte entries through exact allow-lists.

A checkpoint is data someone may hand over (a shared run, a downloaded directory); a pickle can
name any importable callable, and plain ``pickle`` calls what it names. ``torch.distributed.
checkpoint`` reads its ``.metadata`` with plain ``pickle`` and its non-tensor entries (an
optimizer's ``param_groups``) with ``torch.load(weights_only=False)``; :class:`SafeReader` and
:class:`SafePlanner` replace both reads. An allow-list here holds exact ``(module, name)`` pairs
mapped to the objects they stand for: no name is looked up in a module (so no dotted name
``os.system`` under an allowed module resolves), nothing is imported.
"""

from __future__ import annotations

import functools
import io
import pathlib
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.planner import ReadItem

__all__ = [
    "SafePlanner",
    "SafeReader",
    "UnreadableCheckpoint",
    "check_dcp_metadata",
    "load_dcp",
    "load_torch_file",
]


class UnreadableCheckpoint(ValueError):
    """A distributed checkpoint that could not be read: the message is its first failure."""


def load_torch_file(path: Path, mmap: bool = False) -> Any:
    """``torch.load`` of a file the package wrote (a rank file, trainer state, final weights),
    through torch's weights-only unpickler: tensors and plain containers only, on the CPU."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


@functools.cache
def dcp_metadata_globals() -> dict[tuple[str, str], Any]:
    """Every global a DCP ``.metadata`` pickle names, as ``(module, name)`` → the object."""
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


class SafeReader(FileSystemReader):
    """``FileSystemReader`` whose metadata is read through the allow-list instead of ``pickle``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as file:
            metadata = read_dcp_metadata(file.read())
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` whose non-tensor entries load through torch's weights-only
    unpickler (the default planner calls ``torch.load(weights_only=False)``)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def load_dcp(state: dict[str, Any], directory: Path, no_dist: bool = False) -> None:
    """``dcp.load`` of ``directory`` into ``state`` through :class:`SafeReader` and
    :class:`SafePlanner`. A failed read (a damaged ``.distcp``, a refused global) raises
    :class:`UnreadableCheckpoint` with the first rank's error on one line: DCP raises a
    ``BaseException`` holding every rank's traceback, which ``except Exception`` misses."""
    try:
        dcp.load(
            state, storage_reader=SafeReader(directory), planner=SafePlanner(), no_dist=no_dist
        )
    except CheckpointException as error:
        _, (cause, _trace) = min(error.failures.items())
        if isinstance(cause, pickle.UnpicklingError):
            message = "an entry names a global that a checkpoint does not hold (refused unread)"
        else:
            message = f"{type(cause).__name__}: {' '.join(str(cause).split())[:300]}"
        raise UnreadableCheckpoint(message) from None
