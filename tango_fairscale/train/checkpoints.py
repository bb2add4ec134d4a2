"""Checkpoints that a crash never leaves half-written, and resuming from the newest one.

    checkpoints/step0000100/   complete checkpoints (renamed into place when every rank is done)
    checkpoints/.partial-.../  being written; never read, removed on the next start
    checkpoints/latest         the name of the newest complete checkpoint, replaced atomically

Each rank writes its own part (the engine decides what: a shard, or nothing for a replica).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from tango.common.exceptions import ConfigurationError

from ..checks import reason
from ..parallel.engine import Engine
from ..runtime.process_group import barrier


class TrainingStopped(RuntimeError):
    """Training stopped before the last step; its newest checkpoint is intact and resumable."""


def resume_hint(checkpoints: Path) -> str:
    """How to continue: from the newest complete checkpoint, or from the start."""
    latest = checkpoints / "latest"
    where = f"checkpoint {latest.read_text().strip()}" if latest.is_file() else "the start"
    return f"rerun the same command to resume from {where}"


def save_checkpoint(
    engine: Engine,
    checkpoints: Path,
    step: int,
    is_main: bool,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write step ``step``'s checkpoint on every rank and make it ``latest`` (call on all ranks);
    ``extra`` (plain data: callbacks' states, ...) is kept with the step and the RNG state.

    A failed write (a full disk, a lost mount) raises :class:`TrainingStopped` and leaves the
    previous checkpoint ``latest``.
    """
    name = f"step{step:07d}"
    partial = checkpoints / f".partial-{name}"
    client_state = {**(extra or {}), "step": step, "rng": torch.get_rng_state()}
    try:
        engine.save_checkpoint(partial, client_state)
    except OSError as error:
        raise TrainingStopped(
            f"writing checkpoint {name} failed ({error}); {resume_hint(checkpoints)} once it "
            "can be written"
        ) from None
    barrier()
    if is_main:
        final = checkpoints / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        _write_atomically(checkpoints / "latest", name)
        for old in checkpoints.glob("step*"):
            if old.name != name:
                shutil.rmtree(old)
    barrier()


def resume(engine: Engine, checkpoints: Path, is_main: bool) -> dict[str, Any]:
    """Load the newest complete checkpoint into ``engine``; return what :func:`save_checkpoint`
    kept with it (``step``, ``extra``'s keys; ``{}`` when there is none). A checkpoint that
    cannot be loaded (truncated, of another model, holding pickled code) is refused in one line
    naming it. Call on every rank."""
    if is_main:
        for partial in checkpoints.glob(".partial-*"):
            shutil.rmtree(partial)
    barrier()
    latest = checkpoints / "latest"
    if not latest.is_file():
        return {}
    directory = checkpoints / latest.read_text().strip()
    try:
        client_state = engine.load_checkpoint(directory)
    except ConfigurationError:
        raise
    except Exception as error:
        raise ConfigurationError(
            f"checkpoint {directory} cannot be loaded ({reason(error)}); delete {checkpoints} "
            "to start this step over"
        ) from None
    torch.set_rng_state(client_state.pop("rng"))
    return client_state


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
