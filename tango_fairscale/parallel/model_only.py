"""A finished run's final checkpoint without its optimizer state, offline (one process, no process
group): what ``tango_fairscale::train`` does to its work dir once a run finishes (unless
``keep_optimizer_state``), and ``tango-fairscale clean`` to the runs that finished before.

The checkpoint is verified against its manifest; its model-only copy (:meth:`~.checkpoint_format.
CheckpointFormat.save_model_only`: rank files without ``optimizer``, or DCP's ``model`` entry
saved again) is written into ``.partial-stepN`` with its manifest last (the same identity, the new
files' digests, ``model_only``), then swapped in (:func:`~tango_fairscale.records.checkpoints.
install`). A crash leaves the checkpoint as it was, or the copy in its place, or -- between the
two renames -- neither listed: never a checkpoint that loads wrongly. A model-only checkpoint
exports to the same weights; resuming refuses it in one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..checks import reason
from ..records.checkpoints import (
    PARTIAL_PREFIX,
    CheckpointError,
    install,
    read_manifest,
)
from ..records.retention import finished_step, give_back
from .consolidate import FORMATS

__all__ = ["finish_work_dir", "model_only_checkpoint"]


def model_only_checkpoint(directory: Path) -> Path:
    """Rewrite the complete checkpoint ``directory`` without its optimizer state (nothing to do
    when it is model-only already); returns it. Raises :class:`CheckpointError` (one line: it
    does not verify, it cannot be read) or ``OSError`` (it cannot be written), leaving it as it
    was."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest.model_only:
        return directory
    if manifest.format not in FORMATS:
        raise CheckpointError(f"{directory} is in the {manifest.format!r} format, unknown here")
    checkpoint_format = FORMATS[manifest.format]()
    checkpoint_format.verify(directory, manifest)
    partial = directory.with_name(f"{PARTIAL_PREFIX}{directory.name}")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    try:
        checkpoint_format.save_model_only(directory, manifest, partial)
    except BaseException as error:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(error, (CheckpointError, OSError)) or not isinstance(error, Exception):
            raise
        raise CheckpointError(f"cannot rewrite {directory} ({reason(error)})") from None
    return install(partial)


def finish_work_dir(work_dir: Path, keep_optimizer_state: bool = False) -> int:
    """Give back what a finished training step's work dir no longer needs
    (:func:`~tango_fairscale.records.retention.finished_step`): the checkpoints but the final
    one, ``final_weights.pt``, the final checkpoint's optimizer state unless
    ``keep_optimizer_state``. Returns the bytes freed; raises as :func:`model_only_checkpoint`."""
    releases = finished_step(work_dir, keep_optimizer_state=keep_optimizer_state)
    return sum(give_back(release, model_only_checkpoint) for release in releases)
