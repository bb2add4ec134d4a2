"""``tango-fairscale clean``: give back the disk that a local workspace's training steps no longer
need, without breaking a cached result (``tango run`` again still starts no step,
``tango-fairscale results`` still reads every run).

Every ``tango_fairscale::train`` step whose work dir holds checkpoints or ``final_weights.pt``
(:mod:`tango_fairscale.records.retention`), in one of three states:

* **finished** (its result is stored): ``final_weights.pt``, every checkpoint but the final one and
  the final one's optimizer state are deleted -- what a run finished by this version of the
  package already did itself -- unless the step kept its optimizer state (``runtime:
  {keep_optimizer_state: true}``). ``--all-checkpoints`` deletes the final checkpoint too: the
  stored result (``runs/NAME/trained_model``) is the trained model as a Hugging Face directory,
  and ``export --run`` then has no checkpoint to read.
* **running** (a process holds the step's lock): never touched.
* **unfinished** (it failed or was interrupted): its checkpoints resume it, so they are kept unless
  ``--unfinished`` is given; its rerun then trains from the start.

While a step is cleaned its lock (Tango's ``cache/<id>/lock``) is held, so a ``tango run``
reaching it waits. The workspace is read in pure Python (:mod:`tango_fairscale.results`); torch is
imported only to rewrite a checkpoint without its optimizer state
(:mod:`tango_fairscale.parallel.model_only`). ``--dry-run`` deletes nothing and says what would
be freed (the optimizer's share of a checkpoint estimated as the checkpoint less the stored
model's weights).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .records.checkpoints import CheckpointError
from .records.retention import (
    CHECKPOINTS,
    FINAL_WEIGHTS,
    MODEL_ONLY,
    Release,
    finished_step,
    give_back,
    size_of,
    unfinished_step,
)
from .results.workspace import LocalReader, ResultsError, open_reader

__all__ = ["StepCleaning", "clean_workspace", "format_size"]

#: The file Tango's local step cache writes once a step's result is stored.
_STORED = "cache-metadata.json"
_TRAIN = "tango_fairscale::train"


@dataclass
class StepCleaning:
    """One training step of the workspace, cleaned (or, in a dry run, looked at).

    ``state``: ``finished``, ``running`` or ``unfinished``. ``releases``: what was (or would
    be) given back; ``freed``: the bytes freed (a dry run: the bytes it would free, a
    checkpoint's optimizer state estimated); ``estimated``: some of ``freed`` is an estimate;
    ``held``: the bytes of what a step left alone keeps; ``error``: why the cleaning stopped."""

    unique_id: str
    label: str
    state: str
    releases: list[Release] = field(default_factory=list)
    freed: int = 0
    estimated: bool = False
    held: int = 0
    error: str | None = None
    details: list[str] = field(default_factory=list)


def clean_workspace(
    workspace: Any,
    runs: Iterable[str] | None = None,
    *,
    all_checkpoints: bool = False,
    unfinished: bool = False,
    dry_run: bool = False,
) -> list[StepCleaning]:
    """Clean the training steps of a local ``workspace`` (a directory or ``local://`` URL), or
    of the named ``runs`` only (see the module docstring); what was done, step by step. Raises
    :class:`ResultsError` (one line) for another kind of workspace or an unknown run."""
    reader = open_reader(workspace)
    if not isinstance(reader, LocalReader):
        raise ResultsError(
            f"clean frees the files of a local workspace; {reader.url} is not a directory"
        )
    steps = _training_steps(reader, None if runs is None else list(runs))
    return [
        _clean_step(reader, uid, label, config, all_checkpoints, unfinished, dry_run)
        for uid, (label, config) in steps.items()
    ]


def format_size(size: int) -> str:
    """Bytes in decimal units: ``512 B``, ``12.3 kB``, ``620.0 MB``, ``1.42 GB``."""
    if size < 1000:
        return f"{size} B"
    for unit, scale in (("kB", 1e3), ("MB", 1e6)):
        if size < 1000 * scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 1e9:.2f} GB"


def describe(cleaning: StepCleaning, dry_run: bool) -> str:
    """One line: what was (or would be) freed in the step, or why it was left alone."""
    label = cleaning.label
    if cleaning.error is not None:
        done = f" after freeing {format_size(cleaning.freed)}" if cleaning.freed else ""
        return f"{label}: stopped{done}: {cleaning.error}"
    if cleaning.state == "running":
        return f"{label}: running; left as it is"
    if cleaning.state == "unfinished" and not cleaning.releases:
        return (
            f"{label}: failed or interrupted; its checkpoints ({format_size(cleaning.held)}) "
            "resume it, left as they are (--unfinished deletes them; its rerun then trains from "
            "the start)"
        )
    if not cleaning.releases:
        return f"{label}: nothing to free"
    verb = "would free" if dry_run else "freed"
    about = "~" if cleaning.estimated else ""
    return f"{label}: {verb} {about}{format_size(cleaning.freed)} ({', '.join(cleaning.details)})"


# --- the steps ----------------------------------------------------------------------------------


def _training_steps(
    reader: LocalReader, names: list[str] | None
) -> dict[str, tuple[str, dict[str, Any]]]:
    """The steps whose work dirs hold training files, by unique id, oldest first: a label naming
    their runs and step, and their config (``{}`` when unknown)."""
    cache = reader.dir / "cache"
    with_files = {
        directory.name
        for directory in (sorted(cache.iterdir()) if cache.is_dir() else [])
        if _holds_training_files(directory / "work")
    }
    runs: dict[str, list[tuple[float, str, str]]] = {}  # uid → [(start, run, step name)]
    configs: dict[str, dict[str, Any]] = {}
    started: dict[str, float] = {}
    known = reader.run_names()
    unknown = [name for name in names or [] if name not in known]
    if unknown:
        listed = ", ".join(sorted(known)) or "none"
        raise ResultsError(f"no run named {unknown[0]!r} in {reader.url} (runs: {listed})")
    named: set[str] = set()
    for run_name in known:  # every run, to name each step's runs
        try:
            run = reader.run(run_name)
        except (KeyError, ResultsError):
            if names is not None and run_name in names:
                raise
            continue  # unreadable: its steps are listed by id, as steps of no run
        if names is not None and run_name in names:
            named |= {step.unique_id for step in run.steps.values()}
        for step_name, step in run.steps.items():
            start = run.start_date.timestamp()
            runs.setdefault(step.unique_id, []).append((start, run.name, step_name))
            configs[step.unique_id] = step.config or {}
            started[step.unique_id] = min(start, started.get(step.unique_id, start))
    selected = with_files & named if names is not None else with_files
    missing = sorted(uid for uid in selected if uid not in configs)
    for uid, step in reader.step_records(missing).items():
        configs[uid] = step.config or {}
        if step.start_time is not None:
            started[uid] = step.start_time.timestamp()
    steps = {}
    for uid in sorted(selected, key=lambda uid: (started.get(uid, float("inf")), uid)):
        config = configs.get(uid, {})
        if config.get("type", _TRAIN) != _TRAIN:
            continue  # another step's files: not ours to judge
        steps[uid] = (_label(uid, sorted(runs.get(uid, []))), config)
    return steps


def _holds_training_files(work: Path) -> bool:
    return (work / CHECKPOINTS).is_dir() or (work / FINAL_WEIGHTS).is_file()


def _label(uid: str, runs: list[tuple[float, str, str]]) -> str:
    if not runs:
        return f"step {uid} (in no run)"
    step_names = sorted({step for _, _, step in runs})
    run_names = list(dict.fromkeys(run for _, run, _ in runs))
    which = "run" if len(run_names) == 1 else "runs"
    return f"{', '.join(step_names)} of {which} {', '.join(run_names)}"


def _clean_step(
    reader: LocalReader,
    uid: str,
    label: str,
    config: dict[str, Any],
    all_checkpoints: bool,
    unfinished: bool,
    dry_run: bool,
) -> StepCleaning:
    step_dir = reader.dir / "cache" / uid
    work = step_dir / "work"
    with _step_lock(step_dir) as locked:
        if not locked:
            return StepCleaning(uid, label, "running")
        if (step_dir / _STORED).is_file():
            state = "finished"
            runtime = config.get("runtime")
            keep = isinstance(runtime, dict) and bool(runtime.get("keep_optimizer_state", False))
            releases = finished_step(
                work, keep_optimizer_state=keep, all_checkpoints=all_checkpoints
            )
        else:
            state = "unfinished"
            releases = unfinished_step(work) if unfinished else []
        cleaning = StepCleaning(uid, label, state, releases)
        if state == "unfinished" and not unfinished:
            cleaning.held = sum(release.size for release in unfinished_step(work))
            return cleaning
        model_only = _model_only()
        for release in releases:
            if dry_run:
                freed, estimated = _would_free(release, step_dir)
                cleaning.estimated |= estimated
            else:
                try:
                    freed = give_back(release, model_only)
                except (CheckpointError, OSError) as error:
                    cleaning.error = f"{release.describe()}: {' '.join(str(error).split())}"
                    break
            cleaning.freed += freed
            cleaning.details.append(f"{release.describe()} {format_size(freed)}")
        return cleaning


def _would_free(release: Release, step_dir: Path) -> tuple[int, bool]:
    """The bytes ``release`` would free, and whether that is an estimate: a checkpoint's
    optimizer state is the checkpoint less its ``hf`` files and the stored model's weights."""
    if release.action != MODEL_ONLY:
        return release.size, False
    weights = sum(size_of(path) for path in step_dir.glob("*.safetensors"))
    return max(0, release.size - size_of(release.path / "hf") - weights), True


def _model_only() -> Callable[[Path], Path]:
    """:func:`~tango_fairscale.parallel.model_only.model_only_checkpoint`, torch imported on
    the first call only."""

    def rewrite(checkpoint: Path) -> Path:
        from .parallel.model_only import model_only_checkpoint

        return model_only_checkpoint(checkpoint)

    return rewrite


@contextlib.contextmanager
def _step_lock(step_dir: Path) -> Iterator[bool]:
    """Hold the step's lock (Tango's, ``flock``) if no other process does; whether it is held."""
    descriptor = os.open(step_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


def command(
    workspace: str,
    runs: list[str] | None,
    all_checkpoints: bool,
    unfinished: bool,
    dry_run: bool,
) -> int:
    """``tango-fairscale clean``: clean, print one line per training step and the total; the
    exit code (0, or 2 when a step could not be cleaned: its line says why)."""
    cleanings = clean_workspace(
        workspace, runs, all_checkpoints=all_checkpoints, unfinished=unfinished, dry_run=dry_run
    )
    for cleaning in cleanings:
        print(describe(cleaning, dry_run))
    total = sum(cleaning.freed for cleaning in cleanings)
    about = "~" if any(cleaning.estimated for cleaning in cleanings) else ""
    if not cleanings:
        which = "this workspace" if not runs else f"run{'s' * (len(runs) > 1)} {', '.join(runs)}"
        print(f"no training step of {which} holds checkpoints or weights")
    elif dry_run:
        print(f"would free {about}{format_size(total)} in all (a dry run: nothing was deleted)")
    else:
        print(f"freed {format_size(total)} in all")
    return 2 if any(cleaning.error for cleaning in cleanings) else 0
