"""``importlib.metadata.packages_distributions()`` answered from a file kept per set of installed
packages, once, for the import of transformers.

transformers maps every import name to its distributions when it is imported
(``transformers.utils.import_utils``), which reads the file list of every installed package: on an
H100 host's image 0.7-1.1 s of each process that imports transformers (a scoring command, each
training worker; the header of ``profile_lm_eval_h100_a5e020c.txt``), 0.12 s on the 2-core CPU
host. :func:`remember_packages_distributions_once` makes the next call (transformers') read the
mapping from a JSON file named by what it depends on (the Python version and every ``sys.path``
entry, with the modification time of each folder holding package metadata, which changes when a
package is installed or removed there: :func:`installed_key`), written by the first process that
computes it; importlib's function is back in place after that call.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

#: The entries of a folder that hold an installed package's metadata.
METADATA_SUFFIXES = (".dist-info", ".egg-info")
#: How many maps the cache folder keeps (one per set of installed packages), the newest ones.
KEPT_MAPS = 8


def remember_packages_distributions_once() -> None:
    """Answer the next ``importlib.metadata.packages_distributions()`` from the file (see the
    module's docstring), then restore importlib's function."""
    original = importlib.metadata.packages_distributions

    def remembered() -> Mapping[str, list[str]]:
        importlib.metadata.packages_distributions = original
        return packages_distributions(original)

    importlib.metadata.packages_distributions = remembered  # type: ignore[assignment]


def packages_distributions(
    compute: Callable[[], Mapping[str, list[str]]],
) -> dict[str, list[str]]:
    """``compute()`` (importlib's ``packages_distributions``), kept in a file per set of
    installed packages: read from it when it is there, else computed and written."""
    kept = cache_dir() / f"packages_distributions-{installed_key()}.json"
    try:
        mapping = json.loads(kept.read_text(encoding="utf-8"))
        if isinstance(mapping, dict) and all(isinstance(v, list) for v in mapping.values()):
            return mapping
    except (OSError, ValueError):
        pass
    mapping = {name: list(distributions) for name, distributions in compute().items()}
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(mapping), encoding="utf-8")
        os.replace(partial, kept)
        _remove_old_maps(kept.parent)
    except OSError:  # a read-only home: computed every time, as without the file
        pass
    return mapping


def _remove_old_maps(folder: Path) -> None:
    """Keep the :data:`KEPT_MAPS` newest maps of ``folder`` (environments that come and go
    leave theirs behind)."""
    maps = sorted(folder.glob("packages_distributions-*.json"), key=lambda p: p.stat().st_mtime)
    for old in maps[:-KEPT_MAPS]:
        old.unlink(missing_ok=True)


def installed_key() -> str:
    """What the installed packages' metadata depends on: the Python version and each ``sys.path``
    entry, with its modification time where it is a file or a folder holding package metadata
    (a ``*.dist-info`` or ``*.egg-info`` entry: installing or removing a package there changes
    it) — not that of a folder without any, such as a working directory, which changes often
    (hashed)."""
    entries: list[tuple[str, int | str | None]] = []
    for entry in sys.path:
        path = entry or "."
        try:
            holds_metadata = not os.path.isdir(path) or any(
                name.endswith(METADATA_SUFFIXES) for name in os.listdir(path)
            )
            entries.append((entry, os.stat(path).st_mtime_ns if holds_metadata else "no metadata"))
        except OSError:
            entries.append((entry, None))
    return hashlib.sha256(json.dumps([sys.version, entries]).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/tango-fairscale`` (``~/.cache/...`` without it)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "tango-fairscale"
