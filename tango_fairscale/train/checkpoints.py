"""Checkpoints that a crash never leaves half-written, and resuming from the newest one whose
files match its manifest (the directory protocol: :mod:`tango_fairscale.records.checkpoints`).

Each rank writes its part through the engine's checkpoint format (a shard, or nothing for a
replica); rank 0 writes the manifest, renames the directory into place and prunes old ones.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tango.common.exceptions import ConfigurationError

from ..parallel.engine import Engine
from ..records.checkpoints import (
    LATEST,
    CheckpointError,
    DamagedCheckpoint,
    Identity,
    NoManifest,
    clear_partials,
    commit,
    complete_checkpoints,
    partial_dir,
    step_name,
)
from ..runtime.process_group import barrier

logger = logging.getLogger(__name__)


class TrainingStopped(RuntimeError):
    """Training stopped before the last step; its newest checkpoint is intact and resumable."""


@dataclass(frozen=True)
class CheckpointPolicy:
    """Where a run's checkpoints go, the run's id and how many complete ones are kept."""

    directory: Path
    run_id: str
    keep: int = 2


def resume_hint(checkpoints: Path) -> str:
    """How to continue: from the newest complete checkpoint, or from the start."""
    latest = checkpoints / LATEST
    where = f"checkpoint {latest.read_text().strip()}" if latest.is_file() else "the start"
    return f"rerun the same command to resume from {where}"


def save_checkpoint(
    engine: Engine, policy: CheckpointPolicy, step: int, is_main: bool, extra: dict | None = None
) -> None:
    """Write step ``step``'s checkpoint on every rank and make it ``latest``, keeping the newest
    ``policy.keep`` (call on all ranks); ``extra`` (plain data: callbacks' states, ...) is kept
    with the step and the RNG state.

    A failed write (a full disk, a lost mount) raises :class:`TrainingStopped` on every rank and
    leaves the previous checkpoint ``latest``.
    """
    partial = partial_dir(policy.directory, step)
    client_state = {**(extra or {}), "step": step, "rng": torch.get_rng_state()}
    identity = Identity(policy.run_id, step, engine.train_config.world_size)
    try:
        engine.checkpoint_format.save(engine, partial, client_state, identity)
    except OSError as error:
        raise TrainingStopped(
            f"writing checkpoint {step_name(step)} failed ({error}); "
            f"{resume_hint(policy.directory)} once it can be written"
        ) from None
    barrier()
    if is_main:
        commit(partial, policy.keep)
    barrier()


def resume(engine: Engine, checkpoints: Path, is_main: bool) -> dict[str, Any]:
    """Load the newest complete checkpoint whose files match its manifest into ``engine``;
    return what :func:`save_checkpoint` kept with it (``step``, ``extra``'s keys; ``{}`` when
    there is none). A damaged checkpoint (a file missing, of another size or digest, or of
    another checkpoint) is skipped for the one before, which the log says; one that cannot be
    loaded (no manifest, another model, pickled code) is refused in one line naming it. Call on
    every rank."""
    if is_main:
        clear_partials(checkpoints)
    barrier()
    damaged: list[DamagedCheckpoint] = []
    for directory in complete_checkpoints(checkpoints):
        try:
            client_state = engine.checkpoint_format.restore(engine, directory)
        except DamagedCheckpoint as damage:
            damaged.append(damage)
            continue
        except CheckpointError as error:
            raise ConfigurationError(_refusal(directory, checkpoints, error)) from None
        if damaged and is_main:
            skipped = "; ".join(
                f"checkpoint {damage.directory.name} is damaged ({damage.detail})"
                for damage in damaged
            )
            logger.warning("%s; resuming from %s", skipped, directory.name)
        torch.set_rng_state(client_state.pop("rng"))
        return client_state
    if damaged:
        others = ", as is every earlier one" if len(damaged) > 1 else ""
        raise ConfigurationError(
            f"checkpoint {damaged[0].directory} cannot be loaded: it is damaged "
            f"({damaged[0].detail}){others}; delete {checkpoints} to start this step over"
        )
    return {}


def _refusal(directory: Path, checkpoints: Path, error: CheckpointError) -> str:
    if isinstance(error, NoManifest):
        return (
            f"checkpoint {directory} has no manifest: written by a tango_fairscale that did not "
            "checksum checkpoints, its files cannot be verified; finish the run with that "
            f"version, or delete {checkpoints} to start this step over"
        )
    return (
        f"checkpoint {directory} cannot be loaded ({error}); delete {checkpoints} to start this "
        "step over"
    )
