"""Checkpoints that a crash never leaves half-written, and resuming from the newest one whose
files match its manifest (the directory protocol: :mod:`tango_fairscale.records.checkpoints`).

Each rank writes its part through the engine's checkpoint format (a shard, or nothing for a
replica); rank 0 writes the manifest, renames the directory into place and prunes old ones.
:class:`BackgroundWriter` does the same on a thread while training goes on, for every format.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tango.common.exceptions import ConfigurationError

from ..parallel.checkpoint_format import save_model_files
from ..parallel.engine import Engine
from ..parallel.host_copy import HostCopier
from ..records.checkpoints import (
    LATEST,
    CheckpointError,
    DamagedCheckpoint,
    FileRecord,
    Identity,
    Manifest,
    NoManifest,
    clear_partials,
    commit,
    complete_checkpoints,
    partial_dir,
    step_name,
    write_manifest,
)
from ..records.manifest import abandoned_when
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


class BackgroundWriter:
    """A run's checkpoints written by a thread while training goes on, at most one in flight.

    :meth:`save` waits for the previous checkpoint, copies this rank's state to host memory (queued
    on the GPU: the loop does not wait for it) and starts a thread that writes its files into
    ``.partial-stepN``. Every rank's thread then leaves its file records beside them; rank 0's
    thread waits for every rank's, writes the manifest and commits (rename, ``latest``, pruning),
    with no collective of the job's: the loop's own collectives go on undisturbed. A kill at any
    moment leaves ``.partial-`` files that are never read. A failed write is raised on the rank that
    failed at its next :meth:`check` or :meth:`save` (rank 0 too: it waits for the records), as
    :class:`TrainingStopped`. A run's final checkpoint supersedes the write in flight: that one is
    abandoned at its next file write and its ``.partial-`` directory removed, instead of waited for
    (``supersede``). A format whose writes run collectives (DCP's plan exchange) runs them on a gloo
    group of the writer's own, made on every rank here, with the job's collective timeout
    ``timeout_s``. The host memory the copies go to is reserved once, on a thread, by
    :meth:`prepare` (the loop calls it after the first step) and freed by :meth:`close` (the final
    checkpoint's copy lives on as :meth:`final_model_state`, where it holds the whole model)."""

    def __init__(self, engine: Engine, policy: CheckpointPolicy, timeout_s: float) -> None:
        self.engine, self.policy, self.timeout_s = engine, policy, timeout_s
        self.rank = engine.train_config.worker_id
        self.world_size = engine.train_config.world_size
        self.copier = HostCopier()
        self.group = None
        if engine.checkpoint_format.collective_writes and dist.is_initialized():
            self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        self.thread: threading.Thread | None = None
        self.reserving: threading.Thread | None = None  # prepare's, joined by the next save
        self.failure: tuple[int, str] | None = None
        self.abandoning = threading.Event()  # set: the write in flight stops at its next write
        self.writing_step = 0  # the step of the newest write started
        self.final: tuple[Any, Any] | None = None  # the final checkpoint's (snapshot, ready)
        #: Seconds of each background write, from its snapshot to its commit: what a
        #: synchronous write would have stopped the loop for.
        self.write_seconds: list[float] = []

    def save(
        self,
        step: int,
        extra: dict | None = None,
        wait: bool = False,
        model_only: bool = False,
        supersede: bool = False,
    ) -> None:
        """Start writing step ``step``'s checkpoint (call on every rank), without the optimizer
        state when ``model_only``; ``wait``: return once it is committed; ``supersede``: abandon
        the write in flight instead of waiting for it (:meth:`abandon`). With ``wait`` or
        ``supersede``, call on every rank: the ranks meet in a barrier."""
        if supersede:
            self.abandon()
        self.wait()
        self._reserved()
        identity = Identity(self.policy.run_id, step, self.world_size)
        snapshot, ready = self.copier.copy(self._state(identity, extra, model_only))
        self.writing_step = step
        if supersede:
            self.final = (snapshot, ready)
        self.thread = threading.Thread(
            target=self._write,
            args=(snapshot, ready, identity, model_only),
            name=f"checkpoint-{step_name(step)}",
            daemon=True,  # a kill or a crash leaves a .partial- directory, never read
        )
        self.thread.start()
        if wait:
            self.wait()
            barrier()

    def _state(self, identity: Identity, extra: dict | None, model_only: bool = False) -> Any:
        """What this rank's checkpoint ``identity`` holds (references to the state, not copies)."""
        client_state = {**(extra or {}), "step": identity.step, "rng": torch.get_rng_state()}
        if torch.cuda.is_initialized():  # dropout on a GPU draws from the device's generator
            client_state["cuda_rng"] = torch.cuda.get_rng_state()
        return self.engine.checkpoint_format.take(self.engine, client_state, identity, model_only)

    def prepare(self, extra: dict | None = None) -> None:
        """Reserve the host memory of this rank's checkpoints (with ``extra``, as :meth:`save`
        takes it) on a thread while training goes on; call once the optimizer holds its state:
        after the first step. Pinning the copy of a large model's state takes seconds, which the
        first checkpoint would otherwise stop the loop for."""
        state = self._state(Identity(self.policy.run_id, 0, self.world_size), extra)
        self.reserving = threading.Thread(
            target=self.copier.reserve,
            args=(self.copier.size(state),),
            name="checkpoint-memory",
            daemon=True,
        )
        self.reserving.start()

    def final_model_state(self) -> dict[str, torch.Tensor] | None:
        """The whole model as the final checkpoint (the last :meth:`save` with ``supersede``)
        holds it in host memory, where its format keeps the whole model in this rank's copy
        (``None`` otherwise): the trained model without another copy from the device. Waits for
        the copy, not for the write (which only reads it); handed over once."""
        if self.final is None:
            return None
        (snapshot, ready), self.final = self.final, None
        if ready is not None:
            ready.synchronize()
        return self.engine.checkpoint_format.full_model_state(snapshot)

    def close(self) -> None:
        """Wait for the write in flight (as :meth:`wait`), then free the host memory."""
        try:
            self.wait()
        finally:
            self._reserved()
            self.copier.release()

    def _reserved(self) -> None:
        """Wait for :meth:`prepare`'s thread, if any, to have reserved the host memory."""
        if self.reserving is not None:
            self.reserving.join()
            self.reserving = None

    @property
    def busy(self) -> bool:
        """Whether a write is in flight on this rank."""
        return self.thread is not None and self.thread.is_alive()

    def check(self) -> None:
        """Raise the failure of a finished write, if any (without waiting)."""
        if self.thread is not None and not self.thread.is_alive():
            self.wait()

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for the write in flight (on this rank; rank 0: its commit too); raise its
        failure as :class:`TrainingStopped`."""
        if self.thread is not None:
            self.thread.join(timeout_s)
            if self.thread.is_alive():
                return
            self.thread = None
        if self.failure is not None:
            step, detail = self.failure
            self.failure = None
            raise TrainingStopped(
                f"writing checkpoint {step_name(step)} failed ({detail}); "
                f"{resume_hint(self.policy.directory)} once it can be written"
            )

    def abandon(self) -> None:
        """Stop the write in flight at its next file write, on every rank (call on all: they
        meet in a barrier), and remove its ``.partial-`` directory; ``latest`` stays the
        checkpoint before it. A write that ended meanwhile stays as it ended."""
        thread = self.thread if self.busy else None
        if thread is not None:
            self.abandoning.set()
            thread.join()
        self.abandoning.clear()
        barrier()  # no rank's thread writes into the directory any more
        partial = partial_dir(self.policy.directory, self.writing_step)
        if thread is not None and self.rank == 0 and partial.exists():  # else it was committed
            shutil.rmtree(partial, ignore_errors=True)
            logger.info("checkpoint %s abandoned: the final one supersedes it", partial.name)

    def settle(self) -> None:
        """On the way out of a failed run: let the write in flight finish (within the timeout)
        and log, not raise, its failure."""
        try:
            self.wait(self.timeout_s)
        except TrainingStopped as error:
            logger.warning("%s", error)
        if not self.busy:
            self.close()

    def _write(self, snapshot: Any, ready: Any, identity: Identity, model_only: bool) -> None:
        started = time.perf_counter()
        partial = partial_dir(self.policy.directory, identity.step)
        fmt = self.engine.checkpoint_format
        try:
            if ready is not None:
                ready.synchronize()
            partial.mkdir(parents=True, exist_ok=True)
            with abandoned_when(self.abandoning):
                records = fmt.write(snapshot, partial, self.rank, self.group)
            if self.rank == 0:
                records.update(save_model_files(self.engine.wrapped_model, partial))
                files = {**records, **self._other_ranks_records(partial, identity)}
                write_manifest(partial, Manifest(fmt.name, identity, files, model_only=model_only))
                commit(partial, self.policy.keep)
            else:
                _leave(partial / _records_name(self.rank), Manifest(fmt.name, identity, records))
            self.write_seconds.append(time.perf_counter() - started)
        except Exception as error:  # noqa: BLE001 - a full disk, a lost mount, another rank's
            if self.abandoning.is_set():  # superseded (however the write stopped): no failure
                return
            self.failure = (identity.step, str(error) or type(error).__name__)
            if self.rank != 0:  # rank 0 must not wait for records that never come
                failed = partial / _records_name(self.rank, failed=True)
                _leave_text(failed, self.failure[1])

    def _other_ranks_records(self, partial: Path, identity: Identity) -> dict[str, FileRecord]:
        """Every other rank's file records, as each rank's thread leaves them beside its files."""
        files: dict[str, FileRecord] = {}
        deadline = time.monotonic() + self.timeout_s
        for rank in range(1, self.world_size):
            path, failed = partial / _records_name(rank), partial / _records_name(rank, True)
            while not path.exists():
                if self.abandoning.is_set():
                    raise OSError("abandoned")
                if failed.exists():
                    raise OSError(f"rank {rank}: {failed.read_text()}")
                if time.monotonic() > deadline:
                    raise OSError(f"rank {rank} wrote no checkpoint files in {self.timeout_s:g} s")
                time.sleep(0.02)
            part = Manifest.from_json(path.read_text())
            if part.identity != identity:
                raise OSError(f"rank {rank} wrote checkpoint {part.identity}, not {identity}")
            files.update(part.files)
            path.unlink()
        return files


def _records_name(rank: int, failed: bool = False) -> str:
    return f".rank{rank}.{'failed' if failed else 'records'}.json"


def _leave(path: Path, manifest: Manifest) -> None:
    _leave_text(path, manifest.to_json())


def _leave_text(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (rank 0 reads it as soon as it exists)."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def resume(engine: Engine, checkpoints: Path, is_main: bool) -> dict[str, Any]:
    """Load the newest complete checkpoint whose files match its manifest into ``engine``;
    return what :meth:`BackgroundWriter.save` kept with it (``step``, ``extra``'s keys; ``{}`` when
    there is none). A damaged checkpoint (a file missing, of another size or digest, or of
    another checkpoint) is skipped for the one before, which the log says; one that cannot be
    loaded (no manifest, another model, pickled code) is refused in one line naming it. The random
    generators are set as the checkpoint kept them (the CPU's; the GPU's where the run drew on
    one). Call on every rank."""
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
        cuda_rng = client_state.pop("cuda_rng", None)  # where the run drew on a GPU's generator
        if cuda_rng is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(cuda_rng)
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
