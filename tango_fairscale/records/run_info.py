"""What a training run resolved (``run_info.json`` in its work directory): written by rank 0 when
the run starts, read by ``results``; pure Python."""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunInfo:
    """The settings behind a run's figures that its config may leave open (``precision: auto``)
    or not state (the devices a launcher gave). A field is ``None`` when a file does not hold it
    (written by an older version)."""

    precision: str | None = None  # Lightning's name, resolved (never "auto"): precision_label
    world_size: int | None = None  # training processes
    device: str | None = None  # "cuda" or "cpu"
    global_batch: int | None = None  # examples per optimizer step, all ranks
    grad_accum: int | None = None  # micro-batches per optimizer step
    engine: str | None = None  # the engine's class name

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self)) + "\n")

    @classmethod
    def read(cls, path: Path | None) -> RunInfo:
        """The file's record; every field ``None`` when it is missing or unreadable, and each
        field whose value is not of its type (a hand-edited file)."""
        try:
            body = json.loads(path.read_text()) if path is not None else {}
        except (OSError, ValueError):
            body = {}
        if not isinstance(body, dict):
            body = {}
        hints = typing.get_type_hints(cls)
        return cls(
            **{
                field.name: _typed(body.get(field.name), hints[field.name])
                for field in dataclasses.fields(cls)
            }
        )


def _typed(value: Any, hint: Any) -> Any:
    """``value`` if it is of the type ``hint`` (``X | None``) allows, else ``None``."""
    (wanted,) = (kind for kind in typing.get_args(hint) if kind is not type(None))
    ok = isinstance(value, wanted) and not isinstance(value, bool)
    return value if ok else None


def precision_label(precision: str, float8: str | None) -> str:
    """A run's precision as it is recorded and shown: Lightning's name, ``+RECIPE`` where the
    engine's matmuls ran in float8 (``bf16-mixed+tensorwise``)."""
    return f"{precision}+{float8}" if float8 else precision
