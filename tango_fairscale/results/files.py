"""A Tango ``JsonFormat`` result read without Tango: ``data.json`` or ``data.jsonl``, compressed or
not, as data only: a ``_dataclass`` entry (which Tango's ``JsonFormat`` turns into a call of the
class it names, whatever that is) stays a dict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["read_json"]


def read_json(directory: Path, suffix: str) -> Any:
    """The stored JSON (an iterator's items as a list): what ``JsonFormat.read`` returns, except
    that a ``_dataclass`` entry stays a dict."""
    single, lines = directory / f"data.json{suffix}", directory / f"data.jsonl{suffix}"
    path = single if single.exists() or not lines.exists() else lines
    with _open_text(path) as file:
        if path == single:
            return json.load(file)
        return [json.loads(line) for line in file if line.strip()]


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
