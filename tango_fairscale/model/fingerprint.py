"""What a model's (or a task's) files contribute to a step's cache key, so that a directory
changed in place is computed again instead of served stale from the cache.

* A local directory: every file by content, except weight files (``WEIGHT_SUFFIXES``) and files
  over ``CONTENT_LIMIT_BYTES``, which contribute their name, size and modification time (ns): a
  10 GB checkpoint is fingerprinted in milliseconds. Overwriting weights changes their mtime, so
  the key changes; ``touch`` alone changes it too (a recomputation, never a stale result). A copy
  that keeps mtimes (``cp -p``, ``rsync -a``) of *other* weights of the same sizes would collide:
  ``TANGO_FAIRSCALE_HASH_WEIGHTS=1`` hashes every file's content instead. Hidden files are left out.
* A Hugging Face hub id: the commit its ``main`` revision resolves to on the hub (10 s timeout), or,
  offline (``HF_HUB_OFFLINE=1``) or when the hub is unreachable, the commit the local hub cache
  holds for it (``refs/main``); neither: a one-line ``ConfigurationError``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tango.common import Lazy
from tango.common.exceptions import ConfigurationError

#: Files fingerprinted by size and modification time instead of content.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
#: Larger files of any kind are fingerprinted by size and modification time too.
CONTENT_LIMIT_BYTES = 64 * 2**20
#: Set to ``1`` to hash the content of every file, weights included.
HASH_WEIGHTS_VARIABLE = "TANGO_FAIRSCALE_HASH_WEIGHTS"
HUB_TIMEOUT_S = 10.0
_COMMIT = re.compile(r"[0-9a-f]{40}")


def source_fingerprint(source: str) -> tuple[Any, ...]:
    """``("dir", digest)`` for a local directory, ``("hub", id, commit)`` for a hub id, else
    ``("path", source)`` (a path that is no directory: loading it fails with its own message)."""
    if os.path.isdir(source):
        return ("dir", directory_fingerprint(Path(source)))
    if is_hub_id(source):
        return ("hub", source, hub_revision(source).commit)
    return ("path", source)


def is_hub_id(source: str) -> bool:
    """Whether ``source``, not a local directory, reads as ``name`` or ``org/name``."""
    return (
        not os.path.isdir(source)
        and not source.startswith((".", "/", "~"))
        and source.count("/") <= 1
        and bool(source.strip("/"))
    )


def directory_fingerprint(directory: Path) -> str:
    """A digest of ``directory``'s files (see the module docstring), recursively, links followed."""
    paths = []
    for root, dirs, files in os.walk(directory, followlinks=True):
        dirs[:] = sorted(name for name in dirs if not name.startswith("."))
        paths += [Path(root) / name for name in files if not name.startswith(".")]
    return files_fingerprint(sorted(paths), directory)


def files_fingerprint(paths: Iterable[Path], base: Path | None = None) -> str:
    """A digest of ``paths`` (named relative to ``base`` when given): their names, and each
    file's content or, for weight files and large files, its size and modification time."""
    digest = hashlib.blake2b(digest_size=16)
    everything = os.environ.get(HASH_WEIGHTS_VARIABLE) == "1"
    for path in paths:
        name = path.relative_to(base).as_posix() if base is not None else str(path)
        digest.update(name.encode() + b"\0")
        stat = path.stat()
        by_stat = path.suffix in WEIGHT_SUFFIXES or stat.st_size > CONTENT_LIMIT_BYTES
        if by_stat and not everything:
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
        else:
            with path.open("rb") as file:
                for block in iter(lambda: file.read(1 << 20), b""):
                    digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class HubRevision:
    """The commit a hub id resolves to, and whether the hub answered (else the cache did)."""

    commit: str
    online: bool


@functools.cache
def hub_revision(repo_id: str, revision: str = "main") -> HubRevision:
    """The commit ``repo_id@revision`` resolves to: from the hub, else from the local cache; once
    a process. Raises a one-line ``ConfigurationError`` when neither knows it."""
    import httpx
    from huggingface_hub import HfApi, constants

    if _COMMIT.fullmatch(revision):
        return HubRevision(revision, online=False)
    if not constants.HF_HUB_OFFLINE:
        try:
            info = HfApi().model_info(repo_id, revision=revision, timeout=HUB_TIMEOUT_S)
            if info.sha:
                return HubRevision(info.sha, online=True)
        except (OSError, RuntimeError, ValueError, httpx.HTTPError):
            pass  # unreachable (or no such repository): the cache decides
    ref = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}" / "refs" / revision
    if ref.is_file():
        return HubRevision(ref.read_text().strip(), online=False)
    raise ConfigurationError(unreachable(repo_id))


def unreachable(repo_id: str) -> str:
    return (
        f"cannot load model {repo_id!r}: it is not a local directory, the Hugging Face hub is "
        "unreachable (or has no such repository) and the local hub cache does not hold it; pass a "
        f"local directory (-D model=/path/to/dir) or download it where there is network "
        f"(hf download {repo_id})"
    )


class FingerprintedLazy(Lazy):
    """A ``Lazy`` model whose cache key also holds the fingerprints of the ``model`` and
    ``tokenizer`` sources its params name (:func:`source_fingerprint`), taken when it is made:
    a ``Lazy`` alone hashes its params, i.e. a directory's path, not its files."""

    sources: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    @classmethod
    def of(cls, lazy: Lazy) -> FingerprintedLazy:
        made = cls(
            lazy._constructor, params=lazy._params, constructor_extras=lazy._constructor_extras
        )
        fields = lazy._params.as_dict(quiet=True)
        made.sources = tuple(
            (name, source_fingerprint(fields[name]))
            for name in ("model", "tokenizer")
            if isinstance(fields.get(name), str)
        )
        return made

    def det_hash_object(self) -> Any:
        return (Lazy.det_hash_object(self), self.sources)
