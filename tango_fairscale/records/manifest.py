"""A checkpoint's manifest, in pure Python: the identity its files carry, each file's size and
SHA-256 digest (recorded while the file is written, a write that can be abandoned), and their JSON
form."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

#: The file listing a checkpoint's other files, written last.
MANIFEST = "manifest.json"
#: The manifest's layout (a reader refuses another).
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class Identity:
    """What every file of one checkpoint carries: the run (kept across resumes), the step, and
    the number of processes that wrote it."""

    run_id: str
    step: int
    world_size: int

    def __str__(self) -> str:
        processes = "process" if self.world_size == 1 else "processes"
        return f"step {self.step} of run {self.run_id} on {self.world_size} {processes}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Identity:
        """Raises ``ValueError`` unless ``data`` is an identity's :meth:`as_dict`."""
        fields = {"run_id": str, "step": int, "world_size": int}
        if not isinstance(data, dict) or data.keys() != fields.keys():
            raise ValueError(f"not a checkpoint identity: {str(data)[:100]}")
        if not all(type(data[key]) is kind for key, kind in fields.items()):
            raise ValueError(f"not a checkpoint identity: {str(data)[:100]}")
        return cls(**data)


@dataclass(frozen=True)
class FileRecord:
    """A file's size in bytes and SHA-256 digest (hex)."""

    size: int
    sha256: str


class WriteAbandoned(RuntimeError):
    """A write stopped by :func:`abandoned_when`'s event."""


_ABANDON: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "abandon", default=None
)


@contextlib.contextmanager
def abandoned_when(event: threading.Event) -> Iterator[None]:
    """Every :class:`HashingFile` opened inside the block raises :class:`WriteAbandoned` at its
    next write once ``event`` is set (a write in flight that a newer checkpoint supersedes)."""
    token = _ABANDON.set(event)
    try:
        yield
    finally:
        _ABANDON.reset(token)


#: Writes at least this large are hashed on a thread of their own while the file takes them:
#: both release the GIL, so a large write costs the longer of the two instead of their sum
#: (SHA-256 runs at about the page cache's speed).
_OVERLAPPED_BYTES = 1 << 20


def _hash_beside(digest: Any, data: Any) -> threading.Thread:
    """``digest.update(data)`` started on a daemon thread, for the caller to join. Daemon: a
    process that ends without joining its non-daemon threads' work (``exit_now``) must not wait
    for an idle pool's."""
    thread = threading.Thread(
        target=digest.update, args=(data,), name="checkpoint-digest", daemon=True
    )
    thread.start()
    return thread


class HashingFile:
    """A binary file being written that records the size and digest of what passes through
    (hand it to ``torch.save``, ``pickle.dump``, ...); abandoned at a write under
    :func:`abandoned_when`. A large write is hashed while the file takes it, and both are done
    when :meth:`write` returns (the caller may reuse its buffer)."""

    def __init__(self, file: BinaryIO) -> None:
        self._file, self._hash, self._size = file, hashlib.sha256(), 0
        self._abandon = _ABANDON.get()

    def write(self, data: Any) -> int:
        if self._abandon is not None and self._abandon.is_set():
            raise WriteAbandoned(f"the write of {self._file.name} was abandoned")
        view = memoryview(data).cast("B")
        self._size += view.nbytes
        if view.nbytes < _OVERLAPPED_BYTES:
            self._hash.update(view)
            return self._file.write(view)
        hashing = _hash_beside(self._hash, view)
        try:
            return self._file.write(view)
        finally:
            hashing.join()

    def tell(self) -> int:
        return self._file.tell()

    def flush(self) -> None:
        self._file.flush()

    def fileno(self) -> int:
        return self._file.fileno()

    def close(self) -> None:
        self._file.close()

    def record(self) -> FileRecord:
        return FileRecord(self._size, self._hash.hexdigest())

    def __repr__(self) -> str:
        return f"<HashingFile {self._file.name!r}>"


def write_file(path: Path, write: Callable[[HashingFile], object]) -> FileRecord:
    """Create ``path`` with what ``write`` writes into the file it is given, on the disk (not
    only in the page cache) when this returns; its record."""
    with open(path, "wb") as file:
        hashing = HashingFile(file)
        write(hashing)
        file.flush()
        os.fsync(file.fileno())
    return hashing.record()


def replace_durably(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all, on the disk when this returns: ``text`` goes to a
    temporary file, synced, then renamed over ``path``, and the directory synced."""
    temporary = path.with_name(f"{path.name}.tmp")
    with open(temporary, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    sync_directory(path.parent)


def sync_tree(directory: Path) -> None:
    """Put on the disk every file under ``directory`` (written without :func:`write_file`, as
    ``save_pretrained`` writes) and the names of them."""
    paths = sorted(Path(directory).rglob("*"))
    for path in paths:
        if path.is_file():
            with open(path, "rb") as file:
                os.fsync(file.fileno())
    for folder in sorted({path.parent for path in paths} | {Path(directory)}):
        sync_directory(folder)


def sync_directory(directory: Path) -> None:
    """Put on the disk the names created, renamed or removed in ``directory``: a renamed file
    reaches the disk with its data, but its new name only once its directory is synced."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


#: How much of a file :func:`file_record` reads at a time.
_READ_BYTES = 1 << 24


def file_record(path: Path) -> FileRecord:
    """The record of an existing file (read whole; each chunk hashed on a thread while the next
    one is read)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        hashing = None
        while chunk := file.read(_READ_BYTES):
            if hashing is not None:
                hashing.join()
            hashing = _hash_beside(digest, chunk)
        if hashing is not None:
            hashing.join()
    return FileRecord(path.stat().st_size, digest.hexdigest())


@dataclass(frozen=True)
class Manifest:
    """A checkpoint's table of contents: the :mod:`format <tango_fairscale.parallel.
    checkpoint_format>` that reads it, its identity, and each file (a relative POSIX path) with
    its record. Its JSON carries a digest of itself.

    ``model_only``: a finished run's final checkpoint rewritten without its optimizer state
    (:mod:`tango_fairscale.parallel.model_only`): it exports, it does not resume. Written into
    the JSON only when true, so that every other manifest keeps its bytes."""

    format: str
    identity: Identity
    files: dict[str, FileRecord]
    model_only: bool = False

    def to_json(self) -> str:
        body: dict[str, Any] = {
            "version": MANIFEST_VERSION,
            "format": self.format,
            "identity": self.identity.as_dict(),
            "files": {name: asdict(record) for name, record in sorted(self.files.items())},
        }
        if self.model_only:
            body["model_only"] = True
        body["digest"] = _digest(body)
        return json.dumps(body, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Raises ``ValueError`` (a short reason) for anything but :meth:`to_json`'s output."""
        try:
            body = json.loads(text)
        except ValueError:
            raise ValueError("not JSON") from None
        if not isinstance(body, dict) or body.pop("digest", None) != _digest(body):
            raise ValueError("its content does not match its digest")
        if body.get("version") != MANIFEST_VERSION:
            raise ValueError(f"version {body.get('version')!r}; this tango_fairscale reads 1")
        if not isinstance(body.get("format"), str):
            raise ValueError(f"format {body.get('format')!r}, not a format's name")
        model_only = body.get("model_only", False)
        if not isinstance(model_only, bool):
            raise ValueError(f"model_only is {model_only!r}, not a boolean")
        try:
            files = {name: _record(name, record) for name, record in body["files"].items()}
            identity = Identity.from_dict(body["identity"])
            return cls(body["format"], identity, files, model_only)
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"malformed ({type(error).__name__}: {error})") from None


def _record(name: str, record: dict[str, Any]) -> FileRecord:
    posix = PurePosixPath(name)
    if posix.is_absolute() or ".." in posix.parts:
        raise ValueError(f"it lists {name!r}, outside the checkpoint")
    return FileRecord(int(record["size"]), str(record["sha256"]))


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
