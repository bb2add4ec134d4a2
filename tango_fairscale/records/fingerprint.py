"""What the local files a step reads contribute to its cache key, so that files changed in place
are read again instead of a stale result being served from the cache.

One function, :func:`local_fingerprint`, takes the files and directories a thing reads (a model
directory, a task's data and YAML files, PIQA's files) and digests them:

* every file by content, except weight files (``WEIGHT_SUFFIXES``) and files over
  ``CONTENT_LIMIT_BYTES``, which contribute their name, size and modification time (ns): a 10 GB
  checkpoint is fingerprinted in milliseconds. Overwriting weights changes their mtime, so the key
  changes; ``touch`` alone changes it too (a recomputation, never a stale result). A copy that keeps
  mtimes (``cp -p``, ``rsync -a``) of *other* weights of the same sizes would collide:
  ``TANGO_FAIRSCALE_HASH_WEIGHTS=1`` hashes every file's content instead;
* a directory as every file under it, recursively, links followed, hidden files left out;
* a path that does not exist as missing (reading it fails later, with the reader's own message).

Pure Python: no torch, no Tango.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

#: Files fingerprinted by size and modification time instead of content.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
#: Larger files of any kind are fingerprinted by size and modification time too.
CONTENT_LIMIT_BYTES = 64 * 2**20
#: Set to ``1`` to hash the content of every file, weights included.
HASH_WEIGHTS_VARIABLE = "TANGO_FAIRSCALE_HASH_WEIGHTS"


def local_fingerprint(
    paths: Iterable[str | os.PathLike[str]], relative_to: str | os.PathLike[str] | None = None
) -> str:
    """A digest of the files at ``paths`` (files and directories, see the module docstring), each
    named relative to ``relative_to`` (which must hold them) when given, else as given. The same
    names and contents give the same digest in any process."""
    files: list[Path] = []
    for path in map(Path, paths):
        files += _directory_files(path) if path.is_dir() else [path]
    return _digest(files, None if relative_to is None else Path(relative_to))


def _directory_files(directory: Path) -> list[Path]:
    """Every file under ``directory`` but hidden ones, sorted, links followed."""
    files = []
    for root, dirs, names in os.walk(directory, followlinks=True):
        dirs[:] = sorted(name for name in dirs if not name.startswith("."))
        files += [Path(root) / name for name in names if not name.startswith(".")]
    return sorted(files)


def _digest(files: list[Path], base: Path | None) -> str:
    digest = hashlib.blake2b(digest_size=16)
    by_content = os.environ.get(HASH_WEIGHTS_VARIABLE) == "1"
    for path in files:
        name = os.fsencode(path.relative_to(base).as_posix() if base is not None else path)
        try:
            stat = path.stat()
        except OSError:  # missing (or unreadable): the reader will say so
            digest.update(b"\0" + name + b"\0")  # no path holds NUL: unlike any file's entry
            continue
        digest.update(name + b"\0")
        by_stat = path.suffix in WEIGHT_SUFFIXES or stat.st_size > CONTENT_LIMIT_BYTES
        if by_stat and not by_content:
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
        else:
            with path.open("rb") as file:
                for block in iter(lambda: file.read(1 << 20), b""):
                    digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()
