"""The ``torch.distributed.checkpoint`` format (``fsdp2``): sharded state that reshards on load.

A checkpoint holds DCP's ``.metadata`` and ``__{rank}_{n}.distcp`` files, with ``model`` and
``optimizer`` entries (``get_state_dict``'s), and ``trainer.pt`` (rank 0): the scheduler, grad
scaler, client state and the checkpoint's identity. ``.metadata`` carries the identity too (as
DCP's ``save_id``); the ``.distcp`` files are bound to it by their digests in the manifest,
recorded while DCP writes them. A model-only checkpoint (a finished run's final one) holds the
``model`` entry alone, saved by one process.
"""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..checks import reason
from ..records.checkpoints import (
    CheckpointError,
    DamagedCheckpoint,
    FileRecord,
    Identity,
    Manifest,
    file_record,
    write_file,
)
from .checkpoint_format import (
    CheckpointFormat,
    StateOwner,
    identity_mismatch,
    restore_trainer_state,
    torch_saving,
    trainer_state,
)
from .dcp_storage import load_dcp, read_metadata, save_dcp
from .safe_load import load_torch_file, read_dcp_metadata

# torch.distributed.checkpoint is imported where a checkpoint is taken, written or read (here and
# in .dcp_storage): it imports DTensor and sympy (~0.8 s), which a ``tango run`` that touches no
# fsdp2 checkpoint (every step cached, another engine) does not pay.

TRAINER_STATE = "trainer.pt"
DCP_METADATA = ".metadata"


@dataclass
class Snapshot:
    """What :meth:`DistributedCheckpoint.take` returns."""

    state: dict[str, Any]  # {"model": ..., "optimizer": ...}: this rank's shards
    trainer: dict[str, Any] | None  # rank 0's trainer state, with the identity
    identity: Identity


class DistributedCheckpoint(CheckpointFormat):
    """``torch.distributed.checkpoint`` directories: any number of processes loads them."""

    name = "torch-dcp"
    collective_writes = True  # DCP's save exchanges its plans between the ranks

    def take(
        self,
        owner: StateOwner,
        client_state: dict[str, Any],
        identity: Identity,
        model_only: bool = False,
    ) -> Any:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(owner.model, owner.optimizer)
        trainer = None
        if owner.train_config.worker_id == 0:
            trainer = {**trainer_state(owner, client_state), "checkpoint": identity.as_dict()}
        state = (
            {"model": model_state}
            if model_only
            else {
                "model": model_state,
                "optimizer": optimizer_state,
            }
        )
        return Snapshot(state, trainer, identity)

    def write(
        self, snapshot: Any, directory: Path, rank: int, group: Any = None
    ) -> dict[str, FileRecord]:
        records = save_dcp(snapshot.state, directory, snapshot.identity, group=group)
        if snapshot.trainer is not None:
            trainer_file = directory / TRAINER_STATE
            records[TRAINER_STATE] = write_file(trainer_file, torch_saving(snapshot.trainer))
        return records

    def foreign(self, path: Path, identity: Identity) -> str | None:
        try:
            if path.name == TRAINER_STATE:
                found = load_torch_file(path, mmap=True).get("checkpoint")
            elif path.name == DCP_METADATA:
                found = _identity_of(read_dcp_metadata(path.read_bytes()))
            else:
                return None
        except Exception:  # damaged beyond reading: the digest says enough
            return None
        problem = identity_mismatch(found, identity)
        return problem if problem and problem.startswith("of another") else None

    def load(self, owner: StateOwner, directory: Path, manifest: Manifest) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        check_metadata_identity(directory, manifest.identity)
        model_state, optimizer_state = get_state_dict(owner.model, owner.optimizer)
        load_dcp({"model": model_state, "optimizer": optimizer_state}, directory)
        set_state_dict(
            owner.model,
            owner.optimizer,
            model_state_dict=model_state,
            optim_state_dict=optimizer_state,
        )
        trainer = load_torch_file(directory / TRAINER_STATE)
        problem = identity_mismatch(trainer.get("checkpoint"), manifest.identity)
        if problem is not None:
            raise DamagedCheckpoint(directory, TRAINER_STATE, problem)
        return restore_trainer_state(owner, trainer)

    def full_state(self, directory: Path, manifest: Manifest) -> dict[str, torch.Tensor]:
        """The ``model`` entry, read in this process alone (``no_dist``: inside a job, ``dcp.load``
        would otherwise run collectives that the other ranks never join)."""
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        metadata = check_metadata_identity(directory, manifest.identity)
        state: dict[str, Any] = {
            key.removeprefix("model."): torch.empty(item.size, dtype=item.properties.dtype)
            for key, item in metadata.state_dict_metadata.items()
            if key.startswith("model.") and isinstance(item, TensorStorageMetadata)
        }
        if not state:
            raise CheckpointError(f"{directory} is a distributed checkpoint without 'model'")
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            load_dcp({"model": state}, directory, no_dist=True)
        return state

    def write_model_only(
        self, directory: Path, manifest: Manifest, target: Path
    ) -> dict[str, FileRecord]:
        """The ``model`` entry saved again by this process alone (``no_dist``): one ``.distcp``
        file, whatever the number of processes that wrote the checkpoint; ``trainer.pt``
        copied."""
        state = self.full_state(directory, manifest)
        with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            records = save_dcp({"model": state}, target, manifest.identity, no_dist=True)
        shutil.copyfile(directory / TRAINER_STATE, target / TRAINER_STATE)
        records[TRAINER_STATE] = file_record(target / TRAINER_STATE)
        return records


def check_metadata_identity(directory: Path, identity: Identity) -> Any:
    """DCP's metadata of ``directory`` (read through the allow-list), refused as damaged when
    it carries another identity than ``identity``."""
    try:
        metadata = read_metadata(directory)
    except Exception as error:  # unreadable, truncated, not a pickle, a refused global
        raise CheckpointError(f"cannot read {directory / DCP_METADATA} ({reason(error)})") from None
    problem = identity_mismatch(_identity_of(metadata), identity)
    if problem is not None:
        raise DamagedCheckpoint(directory, DCP_METADATA, problem)
    return metadata


def _identity_of(metadata: Any) -> Any:
    save_id = getattr(getattr(metadata, "storage_meta", None), "save_id", None)
    try:
        return json.loads(save_id) if isinstance(save_id, str) else None
    except ValueError:
        return None
