"""Doing to a saved checkpoint what a disk, a careless copy or a forger would."""

from __future__ import annotations

import shutil
from pathlib import Path


def damage_in_place(path: Path) -> None:
    """Overwrite 4 bytes in the middle of ``path`` (inside tensor data) with ``7f7fffff``, the
    largest float32 (3.4e38): the file keeps its size and still loads."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4] = b"\xff\xff\x7f\x7f"
    path.write_bytes(bytes(data))


def truncate(path: Path, keep: int = 1000) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def replace_file(target: Path, source: Path) -> None:
    """``target`` becomes a copy of ``source`` (a file of another checkpoint)."""
    shutil.copyfile(source, target)


def reseal(directory: Path) -> None:
    """Rewrite the manifest of checkpoint ``directory`` for its files as they are now, as a forger
    would: the digests then match and only the loaders stand between the files and the run."""
    from tango_fairscale.records.checkpoints import (
        MANIFEST,
        Manifest,
        file_record,
        read_manifest,
        write_manifest,
    )

    manifest = read_manifest(directory)
    files = {
        path.relative_to(directory).as_posix(): file_record(path)
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }
    write_manifest(directory, Manifest(manifest.format, manifest.identity, files))
