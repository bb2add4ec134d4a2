"""The training log: append-only JSON lines ``{"step": ..., <metric>: ...}`` written by rank 0 into
the step's work directory and stored beside the trained model. Pure Python (read by ``results``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .work_dir import TRAINING_LOG

__all__ = ["TRAINING_LOG", "TrainingLog", "read_training_log", "write_records"]


class TrainingLog:
    """Appends records to ``path`` when ``enabled`` (on rank 0). A last record cut short (a
    crash or a full disk during its write: no final newline) is dropped first; the resumed run
    logs its step again."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        if enabled and path.is_file():
            with path.open("rb+") as file:
                data = file.read()
                if data and not data.endswith(b"\n"):
                    file.truncate(data.rfind(b"\n") + 1)

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with self.path.open("a") as file:
                file.write(json.dumps(record) + "\n")


def read_training_log(path: Path) -> list[dict[str, Any]]:
    """The log's records by step; a step logged twice (replayed after a resume) keeps the last."""
    if not path.is_file():
        return []
    merged: dict[int, dict[str, Any]] = {}
    for record in _json_lines(path.read_text().splitlines()):
        merged.setdefault(record["step"], {}).update(record)
    return [merged[step] for step in sorted(merged)]


def write_records(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Write ``records`` as the whole log at ``path``."""
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def _json_lines(lines: Iterable[str]) -> Iterable[dict[str, Any]]:
    """The records of ``lines``; a line cut short by a crash is no record."""
    for line in lines:
        try:
            record = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            yield record
