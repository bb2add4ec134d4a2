"""The rank-files checkpoint format: one ``torch.save`` file per rank that holds state of its own
(``ddp``, ``pipe``: rank 0's full state; ``fairscale``: every rank's shards and their layout).

``rank{r}.pt`` holds ``{"model", "optimizer", "lr_scheduler", "grad_scaler", "client_state",
"checkpoint"}``, ``checkpoint`` being the checkpoint's identity (a model-only checkpoint's files
lack ``optimizer``). FairScale's files add
``model_metadata`` (FairScale's ``local_metadata_dict()``: which parameters each flat shard
holds, their shapes and padding) and ``world_size``, from which the full state is rebuilt
offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tango.common.exceptions import ConfigurationError

from ..checks import reason
from ..records.checkpoints import (
    CheckpointError,
    DamagedCheckpoint,
    FileRecord,
    Identity,
    Manifest,
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
from .safe_load import load_torch_file


def rank_file(rank: int) -> str:
    return f"rank{rank}.pt"


class RankFiles(CheckpointFormat):
    """Rank files. ``sharded``: every rank writes its own (else rank 0 alone, for all);
    ``reshards``: a checkpoint loads on another number of processes."""

    name = "rank-files"

    def __init__(self, sharded: bool = False, reshards: bool = True) -> None:
        self.sharded, self.reshards = sharded, reshards

    def take(
        self,
        owner: StateOwner,
        client_state: dict[str, Any],
        identity: Identity,
        model_only: bool = False,
    ) -> Any:
        if not self.sharded and owner.train_config.worker_id != 0:
            return None  # every rank holds the same state; rank 0's copy serves all
        optimizer = {} if model_only else {"optimizer": owner.optimizer.state_dict()}
        return {
            "model": owner.model_state(),
            **owner.model_layout(),
            **optimizer,
            **trainer_state(owner, client_state),
            "checkpoint": identity.as_dict(),
        }

    def full_model_state(self, snapshot: Any) -> dict[str, torch.Tensor] | None:
        # As full_state reads a checkpoint: a state without FairScale's shards is the whole model.
        return None if snapshot is None or _holds_shards(snapshot) else snapshot["model"]

    def write(
        self, snapshot: Any, directory: Path, rank: int, group: Any = None
    ) -> dict[str, FileRecord]:
        if snapshot is None:
            return {}
        name = rank_file(rank)
        return {name: write_file(directory / name, torch_saving(snapshot))}

    def foreign(self, path: Path, identity: Identity) -> str | None:
        try:
            found = load_torch_file(path, mmap=True).get("checkpoint")
        except Exception:  # damaged beyond reading: the digest says enough
            return None
        problem = identity_mismatch(found, identity)
        return problem if problem and problem.startswith("of another") else None

    def check_world_size(self, directory: Path, manifest: Manifest, world_size: int) -> None:
        written_by = manifest.identity.world_size
        if self.sharded and not self.reshards and written_by != world_size:
            raise ConfigurationError(
                f"checkpoint {directory} holds the shards of {written_by} processes and this "
                f"engine cannot reshard them; resume with device_count={written_by}"
            )

    def load(self, owner: StateOwner, directory: Path, manifest: Manifest) -> dict[str, Any]:
        rank = owner.train_config.worker_id if self.sharded else 0
        state = read_rank_file(directory, rank, manifest.identity)
        self.check_layout(directory, sharded=_holds_shards(state))
        owner.load_model_state(state["model"])
        owner.optimizer.load_state_dict(state["optimizer"])
        return restore_trainer_state(owner, state)

    def check_layout(self, directory: Path, sharded: bool) -> None:
        """Refuse (one line) a checkpoint whose model is laid out otherwise than this engine
        holds it: FairScale's shards where the whole model is trained, or the reverse. A sharded
        engine trains the whole model on one GPU (nothing to shard there), so a run moved between
        one GPU and CPUs or several GPUs meets it."""
        if sharded == self.sharded:
            return
        held = "FairScale's shards" if sharded else "the whole model"
        here = "shards it" if self.sharded else "trains it whole"
        raise ConfigurationError(
            f"checkpoint {directory} holds {held} and this engine {here} (a sharded engine "
            "trains the whole model on one GPU unless it offloads, compiles or trains in fp16; "
            "elsewhere its shards): resume where it was written, or delete it to train from the "
            "start"
        )

    def full_state(self, directory: Path, manifest: Manifest) -> dict[str, torch.Tensor]:
        identity = manifest.identity
        first = read_rank_file(directory, 0, identity, mmap=True)
        if not _holds_shards(first):
            return dict(first["model"])  # an unsharded engine's full state
        states = [first] + [
            read_rank_file(directory, rank, identity, mmap=True)
            for rank in range(1, identity.world_size)
        ]
        return consolidate_fairscale(
            [state["model"] for state in states], [state["model_metadata"] for state in states]
        )

    def write_model_only(
        self, directory: Path, manifest: Manifest, target: Path
    ) -> dict[str, FileRecord]:
        records = {}
        for rank in range(manifest.identity.world_size):
            name = rank_file(rank)
            if name not in manifest.files:  # unsharded: rank 0's file alone
                continue
            state = read_rank_file(directory, rank, manifest.identity, mmap=True)
            state.pop("optimizer", None)
            records[name] = write_file(target / name, torch_saving(state))
        return records


def read_rank_file(
    directory: Path, rank: int, identity: Identity, mmap: bool = False
) -> dict[str, Any]:
    """Rank ``rank``'s file of the checkpoint of ``identity``, through the weights-only loader;
    :class:`DamagedCheckpoint` if the file carries another identity."""
    name = rank_file(rank)
    try:
        state = load_torch_file(directory / name, mmap=mmap)
    except Exception as error:  # not a torch file, pickled code, unreadable
        raise CheckpointError(f"cannot read {directory / name} ({reason(error)})") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise CheckpointError(f"{directory / name} is not a tango_fairscale rank file")
    problem = identity_mismatch(state.get("checkpoint"), identity)
    if problem is not None:
        raise DamagedCheckpoint(directory, name, problem)
    return state


def consolidate_fairscale(
    shards: list[dict[str, torch.Tensor]], metadata: list[dict[str, Any]]
) -> dict[str, torch.Tensor]:
    """The full state from every rank's ``local_state_dict()`` and ``local_metadata_dict()``.

    As FairScale 0.4.13's ``FSDP.consolidate_shard_weights``, but the shared (tied) parameters of
    *every* FSDP instance are restored: FairScale restores the last instance's only, which drops
    GPT-2's ``lm_head.weight`` whenever the root is not the last instance.
    """
    full: dict[str, torch.Tensor] = {}
    instances = metadata[0]["param_metadata"]
    for index, instance in enumerate(instances):
        prefix = instance["fsdp_path"] + "." if instance["fsdp_path"] else ""
        for backing_name, layout in instance["params"].items():
            pieces = []
            for rank_shards, rank_metadata in zip(shards, metadata):
                shard = rank_shards[prefix + backing_name].flatten()
                padding = rank_metadata["param_metadata"][index]["params"][backing_name]["padding"]
                pieces.append(shard[: shard.numel() - padding])  # padding sits at the end only
                if instance["no_broadcast_optim_state"]:  # not sharded: every rank holds it all
                    break
            flat = torch.cat(pieces)
            if flat.numel() != sum(layout["numels"]):
                raise CheckpointError(
                    f"the shards of {prefix}{backing_name} hold {flat.numel()} values, their "
                    f"layout {sum(layout['numels'])}: the rank files are of different checkpoints"
                )
            for name, shape, piece in zip(
                layout["names"], layout["shapes"], flat.split(layout["numels"])
            ):
                full[prefix + name] = piece.view(shape)
    for instance in instances:
        prefix = instance["fsdp_path"] + "." if instance["fsdp_path"] else ""
        for source, target in instance["shared_param_info"]:
            full[prefix + target] = full[prefix + source]
    for name in metadata[0]["buffer_names"]:  # replicated: rank 0's copy
        full[name] = shards[0][name]
    return full


def _holds_shards(state: dict[str, Any]) -> bool:
    """Whether a rank file holds FairScale's shards (with their metadata), not a whole model."""
    return "model_metadata" in state
