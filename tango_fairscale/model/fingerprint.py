"""What a model's ``model`` and ``tokenizer`` sources contribute to a step's cache key.

* A local directory: the fingerprint of its files
  (:func:`~tango_fairscale.records.fingerprint.local_fingerprint`: small files by content,
  weights and large files by size and modification time).
* A Hugging Face hub id: the commit its ``main`` revision resolves to on the hub (10 s timeout), or,
  offline (``HF_HUB_OFFLINE=1``) or when the hub is unreachable, the commit the local hub cache
  holds for it (``refs/main``); neither: a one-line ``ConfigurationError``.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tango.common import Lazy
from tango.common.exceptions import ConfigurationError

from ..records.fingerprint import WEIGHT_SUFFIXES, local_fingerprint

HUB_TIMEOUT_S = 10.0
_COMMIT = re.compile(r"[0-9a-f]{40}")


def source_fingerprint(source: str) -> tuple[Any, ...]:
    """``("dir", digest)`` for a local directory, ``("hub", id, commit)`` for a hub id, else
    ``("path", source)`` (a path that is no directory: loading it fails with its own message)."""
    if os.path.isdir(source):
        return ("dir", local_fingerprint([source], relative_to=source))
    if is_hub_id(source):
        return ("hub", source, hub_revision(source).commit)
    return ("path", source)


def tokenizer_fingerprint(source: str) -> tuple[Any, ...]:
    """:func:`source_fingerprint` of a tokenizer's source, where a local directory's weights play
    no part (its other files by content), so that the models of one tokenizer share it."""
    if not os.path.isdir(source):
        return source_fingerprint(source)
    files = [
        path
        for path in sorted(Path(source).iterdir())
        if path.is_file()
        and not path.name.startswith(".")
        and not path.name.endswith(WEIGHT_SUFFIXES)
        and not path.name.endswith(".index.json")  # a sharded checkpoint's weight index
    ]
    return ("tokenizer", local_fingerprint(files, relative_to=source))


def is_hub_id(source: str) -> bool:
    """Whether ``source``, not a local directory, reads as ``name`` or ``org/name``."""
    return (
        not os.path.isdir(source)
        and not source.startswith((".", "/", "~"))
        and source.count("/") <= 1
        and bool(source.strip("/"))
    )


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
