"""Which checkpoint a run of a workspace names (``tango-fairscale export --run NAME [--step N]``),
or a training step's result folder: found without Tango or torch, so that a wrong name is refused
in one line at once.

A training step (``tango_fairscale::train`` or Tango's ``torch::train``) keeps its checkpoints in
its work directory, ``cache/<step id>/work/checkpoints/step<N>`` for a local workspace; its result
folder (``cache/<step id>``, which ``runs/<run>/<step>`` links to) holds that ``work/`` directory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .workspace import ResultsError, RunRecord, open_reader

__all__ = ["checkpoint_steps", "run_checkpoint", "work_dir_of"]

_TRAIN_TYPES = ("tango_fairscale::train", "torch::train")
_TRAIN_STEP = "trained_model"
_STEP_DIR = re.compile(r"step(\d+)")


def run_checkpoint(workspace: Any, run_name: str, step: int | None = None) -> Path:
    """The directory to export for run ``run_name`` of ``workspace``: its training step's work
    directory (whose ``latest`` names the newest checkpoint), or with ``step`` the checkpoint of
    that step. Raises :class:`ResultsError` (one line) for an unknown run, a run without a
    training step or without checkpoints, and a step with no checkpoint (naming those there are).
    """
    reader = open_reader(workspace)
    try:
        run = reader.run(run_name)
    except KeyError:
        known = ", ".join(sorted(reader.run_names())) or "none"
        raise ResultsError(f"no run named {run_name!r} in {reader.url} (runs: {known})") from None
    step_name = _train_step(run)
    if step_name is None:
        raise ResultsError(
            f"run {run_name!r} has no training step (steps: {', '.join(run.steps)}): it scored "
            "its model as given, which is already a model directory; there is nothing to export"
        )
    candidates = reader.step_dirs(run.steps[step_name])
    work = next((d for d in candidates if (d / "checkpoints").is_dir() or _is_torch_train(d)), None)
    if work is None:
        raise ResultsError(
            f"run {run_name!r}'s step {step_name!r} wrote no checkpoint (it has not run, or its "
            "checkpoints were deleted)"
        )
    return work if step is None else _at_step(work, step, run_name)


def work_dir_of(path: Path) -> Path:
    """``path``, or its ``work/`` directory when ``path`` is a training step's result folder."""
    work = Path(path) / "work"
    return work if (work / "checkpoints").is_dir() or _is_torch_train(work) else Path(path)


def checkpoint_steps(work: Path) -> dict[int, Path]:
    """The complete checkpoints of a work directory by step (ours: ``checkpoints/step<N>``)."""
    found = {}
    for directory in (work / "checkpoints").glob("step*"):
        match = _STEP_DIR.fullmatch(directory.name)
        if match and directory.is_dir():
            found[int(match.group(1))] = directory
    return dict(sorted(found.items()))


def _at_step(work: Path, step: int, run_name: str) -> Path:
    steps = checkpoint_steps(work)
    if step in steps:
        return steps[step]
    kept = ", ".join(map(str, steps)) or "none"
    raise ResultsError(f"run {run_name!r} has no checkpoint at step {step}; it has steps: {kept}")


def _train_step(run: RunRecord) -> str | None:
    if _TRAIN_STEP in run.steps:
        return _TRAIN_STEP
    names = [n for n, s in run.steps.items() if (s.config or {}).get("type") in _TRAIN_TYPES]
    return sorted(names)[0] if names else None


def _is_torch_train(directory: Path) -> bool:
    return (directory / "checkpoint_state_latest").exists()
