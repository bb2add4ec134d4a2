"""A checkpoint format, the part of an engine that owns a layout on disk: it saves the state with
each file's digest and a manifest, verifies, restores on every rank, and consolidates offline.

The layouts are :class:`~.rank_files.RankFiles` (``ddp``, ``pipe``, ``fairscale``) and
:class:`~.distributed_checkpoint.DistributedCheckpoint` (``fsdp2``); the manifest names the one
that reads a checkpoint (:mod:`tango_fairscale.records.checkpoints`).

Saving is :meth:`CheckpointFormat.take` (this rank's state, on the calling thread) then
:meth:`CheckpointFormat.write` (its files and their records), which a thread may run on a host
copy of what ``take`` returned; a format whose writes run collectives (``collective_writes``) then
runs them on a process group of the thread's own.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, ClassVar, Protocol, TypeVar, cast

import torch
from tango.common.exceptions import ConfigurationError

from ..checks import reason
from ..records.checkpoints import (
    HF_FILES,
    MANIFEST,
    CheckpointError,
    DamagedCheckpoint,
    FileRecord,
    HashingFile,
    Identity,
    Manifest,
    check_file,
    file_record,
    read_manifest,
    share,
    sync_tree,
    write_manifest,
)
from ..runtime.process_group import all_gather_objects

T = TypeVar("T")


class StateOwner(Protocol):
    """What a format saves and restores: an engine (:class:`~.engine.Engine`)."""

    train_config: Any
    model: Any
    optimizer: Any
    lr_scheduler: Any

    @property
    def grad_scaler(self) -> Any: ...

    @property
    def wrapped_model(self) -> Any: ...

    def model_state(self) -> dict[str, torch.Tensor]: ...

    def model_layout(self) -> dict[str, Any]: ...

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None: ...


class CheckpointFormat(ABC):
    """A checkpoint layout: subclasses write, load and consolidate its files."""

    #: The name a manifest records, by which export finds the format.
    name: ClassVar[str]
    #: Whether :meth:`write` runs collectives: a thread that writes while training goes on
    #: (:class:`~tango_fairscale.train.checkpoints.BackgroundWriter`) gives it a group of its
    #: own, so that they never interleave with the loop's.
    collective_writes: ClassVar[bool] = False

    # --- saving: every rank -----------------------------------------------------------------------

    def save(
        self,
        owner: StateOwner,
        directory: Path,
        client_state: dict[str, Any],
        identity: Identity,
        model_only: bool = False,
    ) -> None:
        """Write ``owner``'s state into ``directory``, with ``client_state`` (plain data); rank 0
        adds the model's config and tokenizer and writes the manifest last, listing every rank's
        files. ``model_only``: without the optimizer state (a finished run's final checkpoint).
        Call on every rank (the records are gathered). A failed write on any rank raises
        ``OSError`` on every rank, and no manifest is written."""
        rank = owner.train_config.worker_id
        snapshot = self.take(owner, client_state, identity, model_only)
        records: dict[str, FileRecord] = {}
        failure = None
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if rank == 0:  # torch::train writes over an earlier attempt's directory
                (directory / MANIFEST).unlink(missing_ok=True)
            records = self.write(snapshot, directory, rank)
            if rank == 0:
                records.update(save_model_files(owner.wrapped_model, directory))
        except OSError as error:
            failure = str(error)
        gathered = all_gather_objects((records, failure))
        failures = [failure for _, failure in gathered if failure is not None]
        if failures:
            raise OSError(failures[0])
        if rank == 0:
            files = {name: record for part, _ in gathered for name, record in part.items()}
            write_manifest(directory, Manifest(self.name, identity, files, model_only=model_only))

    @abstractmethod
    def take(
        self,
        owner: StateOwner,
        client_state: dict[str, Any],
        identity: Identity,
        model_only: bool = False,
    ) -> Any:
        """This rank's state to write (``None``: nothing), without the optimizer's when
        ``model_only``: references to the owner's tensors (a background writer would copy them
        to host memory first)."""

    def full_model_state(self, snapshot: Any) -> dict[str, torch.Tensor] | None:
        """The complete model state that ``snapshot`` (from :meth:`take`) holds, keyed as the
        engine's ``full_model_state``, where it holds one (``None``: a shard, or nothing)."""
        return None

    @abstractmethod
    def write(
        self, snapshot: Any, directory: Path, rank: int, group: Any = None
    ) -> dict[str, FileRecord]:
        """Write ``snapshot`` (from :meth:`take`) into ``directory``: this rank's files, each with
        its record (size and digest, computed while writing); the collectives of a format with
        ``collective_writes`` run on ``group`` (``None``: the job's)."""

    # --- verifying ------------------------------------------------------------------------------

    def verify(self, directory: Path, manifest: Manifest, rank: int = 0, world: int = 1) -> None:
        """Raise :class:`DamagedCheckpoint` for the first file of rank ``rank``'s share (every
        file for ``world`` 1) that does not match the manifest."""
        for name in share(manifest.files, rank, world):
            problem = check_file(directory, name, manifest.files[name])
            if problem not in (None, "missing"):  # whose is it?
                problem = self.foreign(directory / name, manifest.identity) or problem
            if problem is not None:
                raise DamagedCheckpoint(directory, name, problem)

    def foreign(self, path: Path, identity: Identity) -> str | None:
        """Why the file ``path``, whose size or digest differs from the manifest's, belongs to
        another checkpoint than ``identity``, when the file says whose it is (``None``
        otherwise)."""
        return None

    def check_world_size(self, directory: Path, manifest: Manifest, world_size: int) -> None:
        """Refuse (``ConfigurationError``) a checkpoint this format cannot load on
        ``world_size`` processes (every format but FairScale's rank files reshards)."""
        return None

    # --- restoring: every rank --------------------------------------------------------------------

    def restore(self, owner: StateOwner, directory: Path) -> dict[str, Any]:
        """Verify ``directory`` (each rank a share of its files) and load it into ``owner``;
        return its client state. Raises on every rank alike: :class:`DamagedCheckpoint` (a file
        does not match the manifest), ``ConfigurationError`` (it cannot be loaded here), or
        :class:`CheckpointError` (it cannot be loaded). Call on every rank."""
        config = owner.train_config
        manifest = on_every_rank(lambda: self._manifest(directory))
        on_every_rank(lambda: self.check_world_size(directory, manifest, config.world_size))
        on_every_rank(lambda: self.verify(directory, manifest, config.worker_id, config.world_size))
        return on_every_rank(lambda: self.load(owner, directory, manifest))

    def _manifest(self, directory: Path) -> Manifest:
        manifest = read_manifest(directory)
        if manifest.format != self.name:
            raise ConfigurationError(
                f"checkpoint {directory} is in the {manifest.format!r} format; this engine reads "
                f"{self.name!r}: resume with the engine that wrote it"
            )
        if manifest.model_only:
            raise CheckpointError(
                f"{directory} holds its finished run's final model without the optimizer state "
                "(keep_optimizer_state was false): it exports, it cannot be resumed"
            )
        return manifest

    @abstractmethod
    def load(self, owner: StateOwner, directory: Path, manifest: Manifest) -> dict[str, Any]:
        """Load this rank's part of the verified checkpoint into ``owner``; its client state.
        Raises :class:`DamagedCheckpoint` for a file that carries another identity."""

    # --- offline ----------------------------------------------------------------------------------

    @abstractmethod
    def full_state(self, directory: Path, manifest: Manifest) -> dict[str, torch.Tensor]:
        """The full model state of the verified checkpoint, in this process alone (no process
        group), under :class:`~tango_fairscale.model.causal_lm.ModelWrapper`'s keys."""

    def save_model_only(self, directory: Path, manifest: Manifest, target: Path) -> Manifest:
        """Write a copy of the verified checkpoint ``directory`` without its optimizer state into
        the empty directory ``target``, in this process alone: this format's files
        (:meth:`write_model_only`), the ``hf`` files copied, the manifest last (the same
        identity, the new files' records, ``model_only``). Returns that manifest."""
        records = self.write_model_only(directory, manifest, target)
        for name in sorted(manifest.files):
            if name.startswith(f"{HF_FILES}/"):
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(directory / name, target / name)
                records[name] = file_record(target / name)
        if (target / HF_FILES).is_dir():
            sync_tree(target / HF_FILES)
        written = Manifest(self.name, manifest.identity, records, model_only=True)
        write_manifest(target, written)
        return written

    @abstractmethod
    def write_model_only(
        self, directory: Path, manifest: Manifest, target: Path
    ) -> dict[str, FileRecord]:
        """Write this format's files of a model-only copy of the verified checkpoint
        ``directory`` into ``target`` (the model's state, the trainer state and the identity,
        no optimizer state); their records."""


def on_every_rank(action: Callable[[], T]) -> T:
    """``action()`` on every rank, raising on every rank the first rank's error if any raised:
    a :class:`CheckpointError` or ``ConfigurationError`` as is, anything else as a
    :class:`CheckpointError` (so that no rank goes on alone into a collective)."""
    try:
        result, failure = action(), None
    except (CheckpointError, ConfigurationError) as error:
        result, failure = None, error
    except Exception as error:  # truncated, pickled code, another model's shapes, ...
        result, failure = None, CheckpointError(reason(error))
    failures = [error for error in all_gather_objects(failure) if error is not None]
    if failures:
        raise failures[0]
    return result  # type: ignore[return-value]


def trainer_state(owner: StateOwner, client_state: dict[str, Any]) -> dict[str, Any]:
    """What every format saves besides the model and optimizer (rank 0's copy serves all)."""
    return {
        "lr_scheduler": owner.lr_scheduler.state_dict() if owner.lr_scheduler else None,
        "grad_scaler": owner.grad_scaler.state_dict() if owner.grad_scaler else None,
        "client_state": client_state,
    }


def restore_trainer_state(owner: StateOwner, state: dict[str, Any]) -> dict[str, Any]:
    """Load :func:`trainer_state`'s output into ``owner``; its client state."""
    if owner.lr_scheduler is not None and state["lr_scheduler"] is not None:
        owner.lr_scheduler.load_state_dict(state["lr_scheduler"])
    if owner.grad_scaler is not None and state["grad_scaler"] is not None:
        owner.grad_scaler.load_state_dict(state["grad_scaler"])
    return dict(state["client_state"])


def torch_saving(obj: Any) -> Callable[[HashingFile], None]:
    """A :func:`~tango_fairscale.records.checkpoints.write_file` writer: ``torch.save(obj)``."""
    return lambda file: torch.save(obj, cast(IO[bytes], file))


def save_model_files(model: Any, directory: Path) -> dict[str, FileRecord]:
    """Write the :class:`~tango_fairscale.model.causal_lm.ModelWrapper`'s Hugging Face config and
    tokenizer (no weights) into ``directory/hf``; their records. Call on one rank."""
    target = directory / HF_FILES
    model.model.config.save_pretrained(target)
    model.tokenizer.save_pretrained(target)
    sync_tree(target)
    files = sorted(path for path in target.rglob("*") if path.is_file())
    return {path.relative_to(directory).as_posix(): file_record(path) for path in files}


def identity_mismatch(found: Any, identity: Identity) -> str | None:
    """The problem with a file that carries ``found`` (an identity's ``as_dict``) in a checkpoint
    of ``identity`` (``None``: it is this checkpoint's)."""
    try:
        other = Identity.from_dict(found)
    except ValueError:
        return "it carries no checkpoint identity"
    if other == identity:
        return None
    return f"of another checkpoint ({other}; the manifest: {identity})"
