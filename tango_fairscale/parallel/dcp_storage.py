"""Saving and loading through ``torch.distributed.checkpoint`` (for the ``fsdp2`` format): DCP's
writer subclassed to record each file's digest while writing it and to carry the checkpoint's
identity in its metadata, its reader and load planner subclassed to read through
:mod:`.safe_load`'s allow-list and torch's weights-only unpickler.

DCP imports DTensor and sympy (~0.8 s), and Tango imports every module of the package, a ``tango
run`` whose steps are all cached included: this module imports DCP only when it saves or loads,
and makes its subclasses of DCP's classes then, once a process (the ``*_class`` functions). The
FSDP2 engine's fork server imports DCP once for its workers (``fsdp2.FSDP2_CODE``).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..checks import reason
from ..records.checkpoints import FileRecord, HashingFile, Identity
from .safe_load import read_dcp_metadata

if TYPE_CHECKING:
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.planner import ReadItem
    from torch.distributed.checkpoint.storage import StorageWriter


class UnreadableCheckpoint(ValueError):
    """A distributed checkpoint that could not be read: the message is its first failure."""


def save_dcp(
    state: dict[str, Any],
    directory: Path,
    identity: Identity,
    no_dist: bool = False,
    group: Any = None,
) -> dict[str, FileRecord]:
    """``dcp.save`` of ``state`` into ``directory``, its metadata carrying ``identity``, its
    collectives on ``group`` (``None``: the job's); the records of the files written. A failed
    write raises ``OSError``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    records: dict[str, FileRecord] = {}
    writer = hashing_writer_class()(directory, identity, records)
    try:
        dcp.save(state, storage_writer=writer, process_group=group, no_dist=no_dist)
    except CheckpointException as error:  # a BaseException, every rank's failures
        _, (cause, _trace) = min(error.failures.items())
        raise (cause if isinstance(cause, OSError) else OSError(reason(cause))) from None
    return records


def load_dcp(state: dict[str, Any], directory: Path, no_dist: bool = False) -> None:
    """``dcp.load`` of ``directory`` into ``state`` through the safe reader and planner. A failed
    read (a damaged ``.distcp``, a refused global) raises :class:`UnreadableCheckpoint` with the
    first rank's error on one line: DCP raises a ``BaseException`` holding every rank's
    traceback, which ``except Exception`` misses."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader, planner = safe_reader_class()(directory), safe_planner_class()()
    try:
        dcp.load(state, storage_reader=reader, planner=planner, no_dist=no_dist)
    except CheckpointException as error:
        _, (cause, _trace) = min(error.failures.items())
        if isinstance(cause, pickle.UnpicklingError):
            message = "an entry names a global that a checkpoint does not hold (refused unread)"
        else:
            message = f"{type(cause).__name__}: {' '.join(str(cause).split())[:300]}"
        raise UnreadableCheckpoint(message) from None


def read_metadata(directory: Path) -> Metadata:
    """DCP's metadata of checkpoint ``directory``, read through the allow-list."""
    return safe_reader_class()(directory).read_metadata()


@functools.cache
def hashing_writer_class() -> Callable[[Path, Identity, dict[str, FileRecord]], StorageWriter]:
    """``_HashingWriter(directory, identity, records)``: DCP's ``FileSystemWriter`` whose file
    system adds each file's record to ``records`` (by name) while writing it, its metadata
    carrying ``identity`` (as ``save_id``)."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import FileSystem
    from torch.distributed.checkpoint.metadata import StorageMeta

    class _HashingFileSystem(FileSystem):
        def __init__(self, records: dict[str, FileRecord]) -> None:
            super().__init__()
            self.records = records

        @contextlib.contextmanager
        def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
            with super().create_stream(path, mode) as stream:
                if "w" not in mode:
                    yield stream
                    return
                hashing = HashingFile(stream)  # type: ignore[arg-type]
                yield hashing
            # DCP fsyncs its files before Python's buffer is flushed into them (at close): their
            # tails (all of .metadata's pickle) would reach the disk after the manifest.
            synced = os.open(path, os.O_RDONLY)
            try:
                os.fsync(synced)
            finally:
                os.close(synced)
            self.records[Path(path).name] = hashing.record()

        def rename(self, path: Any, new_path: Any) -> None:
            super().rename(path, new_path)
            if Path(path).name in self.records:  # .metadata is written as .metadata.tmp first
                self.records[Path(new_path).name] = self.records.pop(Path(path).name)

    class _HashingWriter(FileSystemWriter):
        def __init__(
            self, directory: Path, identity: Identity, records: dict[str, FileRecord]
        ) -> None:
            super().__init__(directory)
            self.fs: _HashingFileSystem = _HashingFileSystem(records)
            self.identity = identity

        def storage_meta(self) -> StorageMeta | None:
            save_id = json.dumps(self.identity.as_dict(), sort_keys=True)
            return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=save_id)

    return _HashingWriter


@functools.cache
def safe_reader_class() -> type[FileSystemReader]:
    """``SafeReader``: DCP's ``FileSystemReader`` whose metadata is read through the allow-list
    instead of ``pickle``."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as file:
                metadata = read_dcp_metadata(file.read())
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader


@functools.cache
def safe_planner_class() -> type[DefaultLoadPlanner]:
    """``SafePlanner``: DCP's ``DefaultLoadPlanner`` whose non-tensor entries load through
    torch's weights-only unpickler (DCP's own calls ``torch.load(weights_only=False)``)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                fqn = read_item.dest_index.fqn
                set_element(self.original_state_dict, self.mappings[fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return SafePlanner
