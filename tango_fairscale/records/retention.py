"""What a training step's work directory holds that nothing needs once the step is finished, and
giving it back, in pure Python (``tango-fairscale clean`` lists it without torch).

A ``tango_fairscale::train`` step's work directory (``cache/<step id>/work`` in a local
workspace)::

    final_weights.pt           the consolidated model, handed from the training processes to the
                               step; the stored result holds the same weights
    checkpoints/stepN/         complete checkpoints: the newest resumes the step, every one exports
    checkpoints/.partial-*     left by a crash or an interrupted deletion
    training_log.jsonl, run_info.json   read by ``tango-fairscale results``: always kept

Once the step's result is stored, a rerun loads the result and starts no training, so only
export reads the checkpoints: a finished step keeps its final checkpoint (the one ``latest``
names) without its optimizer state, and nothing else. Before the result is stored (the step's
process stopped after finishing), the rerun consolidates that checkpoint again instead of
training (:func:`finished_checkpoint`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .checkpoints import (
    PARTIAL_PREFIX,
    CheckpointError,
    complete_checkpoints,
    discard,
    latest_checkpoint,
    read_manifest,
)
from .work_dir import CHECKPOINTS, FINAL_WEIGHTS

__all__ = [
    "CHECKPOINTS",
    "FINAL_WEIGHTS",
    "Release",
    "finished_checkpoint",
    "finished_step",
    "give_back",
    "size_of",
    "unfinished_step",
]


#: What :func:`give_back` does with a path: delete it, or rewrite a checkpoint model-only.
DELETE, MODEL_ONLY = "delete", "model-only"


@dataclass(frozen=True)
class Release:
    """One thing to give back: ``path`` deleted (``DELETE``), or the checkpoint ``path``
    rewritten without its optimizer state (``MODEL_ONLY``). ``size``: the bytes ``path`` holds
    now (all of them freed by a deletion; a rewrite frees the optimizer's share)."""

    action: str
    path: Path
    size: int

    def describe(self) -> str:
        """``checkpoint step0000015``, ``the optimizer state of step0000020``, ..."""
        name = self.path.name
        if self.action == MODEL_ONLY:
            return f"the optimizer state of {name}"
        if self.path.parent.name == CHECKPOINTS and not name.startswith(PARTIAL_PREFIX):
            return f"checkpoint {name}"
        if name == CHECKPOINTS:
            return "every checkpoint"
        return name


def finished_step(
    work_dir: Path, *, keep_optimizer_state: bool = False, all_checkpoints: bool = False
) -> list[Release]:
    """What a finished step's work dir can give back, deletions first: leftovers of crashes,
    every complete checkpoint but the final one, ``final_weights.pt``; then the final
    checkpoint's optimizer state (unless ``keep_optimizer_state``, or it holds none) -- or, with
    ``all_checkpoints``, the whole ``checkpoints`` directory instead."""
    work_dir = Path(work_dir)
    checkpoints = work_dir / CHECKPOINTS
    releases = [_release(DELETE, path) for path in sorted(work_dir.glob(f"{PARTIAL_PREFIX}*"))]
    if (work_dir / FINAL_WEIGHTS).is_file():
        releases.append(_release(DELETE, work_dir / FINAL_WEIGHTS))
    if not checkpoints.is_dir():
        return releases
    if all_checkpoints:
        return [*releases, _release(DELETE, checkpoints)]
    final = latest_checkpoint(checkpoints)
    leftovers = sorted(checkpoints.glob(f"{PARTIAL_PREFIX}*"))
    older = [path for path in complete_checkpoints(checkpoints) if path != final]
    releases[:0] = [_release(DELETE, path) for path in [*leftovers, *older]]
    if final is not None and not keep_optimizer_state and _holds_optimizer_state(final):
        releases.append(_release(MODEL_ONLY, final))
    return releases


def unfinished_step(work_dir: Path) -> list[Release]:
    """Everything a step that did not finish keeps to resume: its checkpoints and
    ``final_weights.pt`` (deleted, its rerun trains from the start)."""
    work_dir = Path(work_dir)
    paths = [*sorted(work_dir.glob(f"{PARTIAL_PREFIX}*")), work_dir / FINAL_WEIGHTS]
    paths.append(work_dir / CHECKPOINTS)
    return [_release(DELETE, path) for path in paths if path.exists()]


def finished_checkpoint(checkpoints: Path) -> Path | None:
    """The final checkpoint of a finished run whose result may not be stored yet: the newest
    complete one when it is model-only (``None`` otherwise: a run to resume or train)."""
    final = latest_checkpoint(checkpoints)
    if final is None:
        return None
    try:
        return final if read_manifest(final).model_only else None
    except CheckpointError:  # refused, with its reason, where the run resumes
        return None


def give_back(release: Release, model_only: Callable[[Path], object]) -> int:
    """Carry out ``release``; the bytes freed. ``model_only(checkpoint)`` rewrites a checkpoint
    without its optimizer state (:func:`tango_fairscale.parallel.model_only.model_only_checkpoint`:
    verified first, written beside it and swapped in). A checkpoint is renamed out of the
    listing before it is deleted, a directory to a ``.partial-`` name: a crash midway leaves
    nothing that looks complete. Raises ``OSError`` (and ``model_only``'s errors)."""
    path = release.path
    if release.action == MODEL_ONLY:
        model_only(path)
        return max(0, release.size - size_of(path))
    if path.parent.name == CHECKPOINTS and path.is_dir() and not path.name.startswith("."):
        discard(path)
    elif path.is_dir() and not path.name.startswith(PARTIAL_PREFIX):
        doomed = path.with_name(f"{PARTIAL_PREFIX}{path.name}")
        if doomed.exists():
            shutil.rmtree(doomed)
        os.replace(path, doomed)
        shutil.rmtree(doomed)
    elif path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    return release.size


def size_of(path: Path) -> int:
    """The bytes of a file, or of every file under a directory (symbolic links not followed)."""
    path = Path(path)
    if path.is_symlink() or not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            file = Path(root) / name
            if not file.is_symlink():
                total += file.stat().st_size
    return total


def _release(action: str, path: Path) -> Release:
    return Release(action, path, size_of(path))


def _holds_optimizer_state(checkpoint: Path) -> bool:
    """Whether a complete checkpoint can be rewritten model-only: its manifest reads and does
    not say ``model_only`` (a checkpoint without a readable manifest is left as it is)."""
    try:
        return not read_manifest(checkpoint).model_only
    except CheckpointError:
        return False
