"""The checkpoint directory protocol, in pure Python: names, the typed manifest, verification,
listing, committing and pruning.

    checkpoints/run_id                 the run's id, made once: a run keeps it across resumes
    checkpoints/step0000100/           a complete checkpoint; the newest ``keep`` are kept
        manifest.json                  written last: format, identity, each file's size and digest
    checkpoints/.partial-step0000200/  being written; never read, removed on the next start
    checkpoints/latest                 the name of the newest complete checkpoint

A ``.partial-`` directory is renamed to ``stepN`` once its manifest is written, so a ``stepN``
directory is complete; its files are trusted once they match the manifest (:func:`check_file`).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

from .manifest import (
    MANIFEST,
    FileRecord,
    HashingFile,
    Identity,
    Manifest,
    file_record,
    replace_durably,
    sync_directory,
    sync_tree,
    write_file,
)

__all__ = [
    "HF_FILES",
    "LATEST",
    "MANIFEST",
    "PARTIAL_PREFIX",
    "CheckpointError",
    "DamagedCheckpoint",
    "FileRecord",
    "HashingFile",
    "Identity",
    "Manifest",
    "NoManifest",
    "check_file",
    "checkpoint_dir",
    "clear_partials",
    "commit",
    "complete_checkpoints",
    "discard",
    "file_record",
    "find_checkpoint",
    "install",
    "latest_checkpoint",
    "partial_dir",
    "read_manifest",
    "run_id",
    "share",
    "step_name",
    "step_of",
    "sync_tree",
    "write_file",
    "write_manifest",
]

#: Prefix of a checkpoint still being written.
PARTIAL_PREFIX = ".partial-"
#: The file naming the newest complete checkpoint.
LATEST = "latest"
#: The file holding the run's id, beside the checkpoints.
RUN_ID = "run_id"
#: A checkpoint's subdirectory holding the model's config and tokenizer.
HF_FILES = "hf"
#: torch::train's link to its newest checkpoint, in its work dir.
TORCH_TRAIN_LATEST = "checkpoint_state_latest"
WHERE = "give a checkpoint (.../checkpoints/stepN), its checkpoints/ directory or the work dir"
_STEP = re.compile(r"step(\d{7,})")


class CheckpointError(ValueError):
    """A directory that is not a complete, trustworthy checkpoint (the message is one line)."""


class NoManifest(CheckpointError):
    """A checkpoint without a manifest: written before checkpoints carried one."""


class DamagedCheckpoint(CheckpointError):
    """A checkpoint whose file ``file`` does not match its manifest (``problem``: missing, its
    size, its digest, another checkpoint's identity). Resuming falls back to an earlier one."""

    def __init__(self, directory: Path, file: str, problem: str) -> None:
        super().__init__(f"{directory} is damaged ({file}: {problem})")
        self.directory, self.file, self.problem = Path(directory), file, problem

    def __reduce__(self) -> tuple:  # crosses processes in a gather
        return (type(self), (self.directory, self.file, self.problem))

    @property
    def detail(self) -> str:
        return f"{self.file}: {self.problem}"


# --- names ------------------------------------------------------------------------------------


def step_name(step: int) -> str:
    """The name of step ``step``'s checkpoint directory: ``step0000100``."""
    return f"step{step:07d}"


def step_of(name: str) -> int | None:
    """The step a checkpoint directory's name holds (``None``: not a ``stepN`` name)."""
    match = _STEP.fullmatch(name)
    return int(match.group(1)) if match else None


def partial_dir(checkpoints: Path, step: int) -> Path:
    """Where step ``step``'s checkpoint is written before :func:`commit`."""
    return checkpoints / f"{PARTIAL_PREFIX}{step_name(step)}"


# --- writing and reading a manifest ------------------------------------------------------------


def write_manifest(directory: Path, manifest: Manifest) -> None:
    """Write ``manifest`` into ``directory`` (atomically and on the disk; after every file it
    lists)."""
    replace_durably(directory / MANIFEST, manifest.to_json())


def read_manifest(directory: Path) -> Manifest:
    """The manifest of checkpoint ``directory``, checked against its own digest and the step its
    name holds. Raises :class:`NoManifest` or :class:`DamagedCheckpoint` (one line)."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise NoManifest(
            f"{directory} has no {MANIFEST}: it was written before tango_fairscale checksummed "
            "its checkpoints, so its files cannot be verified"
        )
    try:
        manifest = Manifest.from_json(path.read_bytes().decode())
    except (ValueError, UnicodeDecodeError) as error:
        raise DamagedCheckpoint(directory, MANIFEST, str(error)) from None
    step = step_of(Path(directory).name)
    if step is not None and step != manifest.identity.step:
        raise DamagedCheckpoint(directory, MANIFEST, f"of {manifest.identity}, not of step {step}")
    return manifest


def check_file(directory: Path, name: str, expected: FileRecord) -> str | None:
    """What is wrong with file ``name`` of ``directory`` against its record (``None``: nothing).
    Reads the whole file."""
    path = directory / name
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size != expected.size:
        return f"{size} bytes, {expected.size} in the manifest"
    if file_record(path).sha256 != expected.sha256:
        return "checksum mismatch"
    return None


def share(files: dict[str, FileRecord], rank: int, world_size: int) -> list[str]:
    """The files that rank ``rank`` of ``world_size`` verifies: each file goes to the rank with
    the fewest bytes so far, largest first (the same split on every rank)."""
    loads = [0] * world_size
    mine = []
    for name in sorted(files, key=lambda name: (-files[name].size, name)):
        least = loads.index(min(loads))
        loads[least] += files[name].size
        if least == rank:
            mine.append(name)
    return mine


# --- a run's checkpoints ----------------------------------------------------------------------


def complete_checkpoints(checkpoints: Path) -> list[Path]:
    """The complete checkpoints in ``checkpoints`` (``stepN`` directories), newest first."""
    if not checkpoints.is_dir():
        return []
    found = {path: step_of(path.name) for path in checkpoints.iterdir() if path.is_dir()}
    steps = {path: step for path, step in found.items() if step is not None}
    return sorted(steps, key=steps.__getitem__, reverse=True)


def latest_checkpoint(checkpoints: Path) -> Path | None:
    """The complete checkpoint that ``latest`` names when it exists, else the newest complete one
    (``None``: there is none)."""
    latest = checkpoints / LATEST
    if latest.is_file():
        named = checkpoints / latest.read_text().strip()
        if step_of(named.name) is not None and named.is_dir():
            return named
    complete = complete_checkpoints(checkpoints)
    return complete[0] if complete else None


def commit(partial: Path, keep: int) -> Path:
    """Make the fully written ``partial`` checkpoint complete: rename it to its ``stepN`` name
    (replacing one of that name: after a fallback), name it in ``latest`` and delete all but the
    newest ``keep`` complete checkpoints up to it. Checkpoints of later steps belong to a
    training the run went back from (it resumed from an earlier one: a later one was damaged)
    and are deleted too, so the one just committed is never what is pruned."""
    checkpoints = partial.parent
    final = install(partial)
    replace_durably(checkpoints / LATEST, final.name)
    complete = complete_checkpoints(checkpoints)  # newest first: later steps before ``final``
    position = complete.index(final)
    for old in complete[:position] + complete[position + keep :]:
        discard(old)
    return final


def install(partial: Path) -> Path:
    """Rename the fully written ``partial`` checkpoint to its ``stepN`` name, replacing a complete
    one of that name: that one is renamed out of the listing first and deleted once ``partial``
    is in place, so that a crash leaves either of the two complete, or neither listed (the one
    set aside and ``partial`` are then ``.partial-`` directories), never a mix."""
    final = partial.with_name(partial.name.removeprefix(PARTIAL_PREFIX))
    doomed = _set_aside(final, REPLACED) if final.exists() else None
    os.replace(partial, final)
    sync_directory(final.parent)
    if doomed is not None:
        shutil.rmtree(doomed)
    return final


def discard(directory: Path) -> None:
    """Delete a complete checkpoint, renamed out of the listing first: a crash midway leaves a
    ``.partial-`` directory (removed on the next start), never a half-deleted ``stepN``."""
    shutil.rmtree(_set_aside(directory))


#: How a complete checkpoint renamed out of the listing is named: to be deleted (pruned), or
#: replaced by a new checkpoint of its step (:func:`install`: restored if the new one is not in
#: place when the run starts again).
DISCARDED, REPLACED = "discarded-", "replaced-"


def _set_aside(directory: Path, why: str = DISCARDED) -> Path:
    doomed = directory.with_name(f"{PARTIAL_PREFIX}{why}{directory.name}")
    if doomed.exists():
        shutil.rmtree(doomed)
    os.replace(directory, doomed)
    return doomed


def clear_partials(checkpoints: Path) -> None:
    """Remove the checkpoints that a stopped run left half-written; a complete one that was set
    aside for a replacement that did not land (:func:`install` stopped between its renames) is
    put back."""
    for replaced in checkpoints.glob(f"{PARTIAL_PREFIX}{REPLACED}*"):
        original = replaced.with_name(replaced.name.removeprefix(PARTIAL_PREFIX + REPLACED))
        if not original.exists():
            os.replace(replaced, original)
            sync_directory(checkpoints)
    for partial in checkpoints.glob(f"{PARTIAL_PREFIX}*"):
        shutil.rmtree(partial)


def run_id(directory: Path) -> str:
    """The id of the run whose checkpoints live in ``directory``: made by whoever asks first
    (atomically: every process gets the same one) and kept there, so a run keeps it across
    resumes and copies of its checkpoints."""
    path = Path(directory) / RUN_ID
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{RUN_ID}.{uuid.uuid4().hex}")
        temporary.write_text(uuid.uuid4().hex[:16])
        try:
            os.link(temporary, path)  # fails if another process made it first
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
    return path.read_text().strip()


# --- naming a checkpoint (export) ---------------------------------------------------------------


def find_checkpoint(path: Path) -> Path:
    """The complete checkpoint directory that ``path`` names: ``path`` itself, the one its
    ``latest`` names (``path`` a ``checkpoints/`` directory or a work dir holding one), or
    torch::train's ``checkpoint_state_latest`` in a work dir."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory; {WHERE}")
    for latest in (path / "checkpoints" / LATEST, path / LATEST):
        if latest.is_file():
            return checkpoint_dir(latest.parent / latest.read_text().strip())
    if (path / TORCH_TRAIN_LATEST).exists():
        return checkpoint_dir((path / TORCH_TRAIN_LATEST).resolve())
    if (path / "checkpoints").is_dir():
        raise CheckpointError(
            f"{path / 'checkpoints'} holds no complete checkpoint yet (no '{LATEST}'); export it "
            "once the run has written one"
        )
    return checkpoint_dir(path)


def checkpoint_dir(directory: Path) -> Path:
    """``directory`` if it is a complete checkpoint (it holds a manifest); one line otherwise."""
    if directory.name.startswith(PARTIAL_PREFIX):
        raise CheckpointError(
            f"{directory} is a partial checkpoint (its run stopped while writing it); export "
            f"the complete one that {directory.parent / LATEST} names"
        )
    if not directory.is_dir():
        raise CheckpointError(f"{directory} does not exist; {WHERE}")
    if (directory / MANIFEST).is_file() or _looks_like_a_checkpoint(directory.iterdir()):
        return directory  # without a manifest: refused by read_manifest, in one line
    raise CheckpointError(f"{directory} holds no checkpoint (no {MANIFEST}); {WHERE}")


def _looks_like_a_checkpoint(paths: Iterable[Path]) -> bool:
    return any(re.fullmatch(r"rank\d+\.pt|\.metadata|.*\.distcp", p.name) for p in paths)
