"""A Tango ``JsonFormat`` result read without Tango: ``data.json`` or ``data.jsonl``, compressed or
not; a result that encodes dataclasses is left to Tango (:class:`NotPlainJson`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["NotPlainJson", "read_json"]


class NotPlainJson(Exception):
    """The JSON encodes dataclasses, which only Tango's JsonFormat rebuilds."""


def _dataclass_hook(obj: dict[str, Any]) -> dict[str, Any]:
    if "_dataclass" in obj:
        raise NotPlainJson
    return obj


def read_json(directory: Path, suffix: str) -> Any:
    """What ``JsonFormat.read`` returns (an iterator's items as a list)."""
    single, lines = directory / f"data.json{suffix}", directory / f"data.jsonl{suffix}"
    path = single if single.exists() or not lines.exists() else lines
    with _open_text(path) as file:
        if path == single:
            return json.load(file, object_hook=_dataclass_hook)
        return [json.loads(line, object_hook=_dataclass_hook) for line in file if line.strip()]


def _open_text(path: Path) -> Any:
    if path.name.endswith(".gz"):
        import gzip

        return gzip.open(path, "rt")
    if path.name.endswith(".bz2"):
        import bz2

        return bz2.open(path, "rt")
    if path.name.endswith(".xz"):
        import lzma

        return lzma.open(path, "rt")
    return path.open()
