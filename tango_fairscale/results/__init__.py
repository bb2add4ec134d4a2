"""Summarise the runs of a workspace: configuration, this run's own state, lm-eval metrics per task.

Reads step infos, the metrics result and the training log (``training_log.jsonl``) and the
optional ``run_info.json`` of the training step through :mod:`.workspace`: importing this
module imports neither torch nor Tango, and model weights are never loaded. A run's state is its
own: a step that a later run executed again (e.g. after this run's attempt failed) is not counted
as done by this one.

::

    from tango_fairscale.results import collect_runs, format_table, plot_curves
    summaries = collect_runs("workspace")
    print(format_table(summaries))
    plot_curves("workspace", [s.name for s in summaries], "curves.png")
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Union

from ..records.training_log import TRAINING_LOG, read_training_log
from .distinct import fold_reruns, labels
from .metrics import TaskMetrics, task_metrics
from .plot import draw_curves, plot_formats
from .report import format_table
from .run_state import StepStatus, step_statuses
from .summary import METRICS_STEP, RUN_INFO, TRAIN_STEP, RunSummary, summarise, train_file
from .workspace import ResultsError, RunRecord, WorkspaceReader, open_reader

__all__ = [
    "METRICS_STEP",
    "RUN_INFO",
    "TRAIN_STEP",
    "ResultsError",
    "RunSummary",
    "StepStatus",
    "TaskMetrics",
    "check_plot_path",
    "collect_runs",
    "fold_reruns",
    "format_table",
    "labels",
    "open_workspace",
    "plot_curves",
    "task_metrics",
    "training_curves",
    "training_log_path",
]

WorkspaceLike = Union[WorkspaceReader, Any, str, "os.PathLike[str]"]


def open_workspace(workspace: WorkspaceLike) -> WorkspaceReader:
    """A reader for a path, a URL (``local:///tmp/ws``, ``beaker://...``) or a Tango ``Workspace``.

    Raises :class:`ResultsError` when a local workspace does not exist (instead of creating an
    empty one, as ``Workspace.from_url`` does) or the URL's workspace type is unknown.
    """
    return open_reader(workspace)


def collect_runs(
    workspace: WorkspaceLike,
    run_names: Iterable[str] | None = None,
    unreadable: list[str] | None = None,
) -> list[RunSummary]:
    """Summaries of the named runs in that order, or of all runs ordered by start date.

    Raises :class:`ResultsError` for an unknown run name or a workspace without runs. Runs that
    failed or did not finish are summarised with their status, never raised. A run whose records
    cannot be read (a truncated ``stepinfo.json``, a corrupt step info) raises
    :class:`ResultsError`, or, when ``unreadable`` is a list, is left out with one line appended
    to it (``run NAME: REASON``).
    """
    reader = open_workspace(workspace)
    names = reader.run_names() if run_names is None else list(dict.fromkeys(run_names))
    if not names:
        raise ResultsError(f"workspace {reader.url} has no registered runs")
    summaries = []
    for name in names:
        try:
            summaries.append(summarise(reader, _registered_run(reader, name)))
        except _UnreadableRun as error:
            if unreadable is None:
                raise
            unreadable.append(f"run {name}: {error}")
    if run_names is None:
        summaries.sort(key=lambda summary: (summary.start_date, summary.name))
    return summaries


def training_log_path(workspace: WorkspaceLike, run_name: str) -> Path | None:
    """The run's ``training_log.jsonl``, or ``None`` when it did not train or logged nothing.

    That is the file in the training step's result directory, else the one being written in its
    work directory; ``None`` too when a later run trained the step again (the log is not this
    run's).
    """
    reader = open_workspace(workspace)
    run = _registered_run(reader, run_name)
    return train_file(reader, run, step_statuses(reader, run), TRAINING_LOG)


def training_curves(workspace: WorkspaceLike, run_name: str) -> list[dict[str, Any]]:
    """The run's training log records ordered by step (a replayed step merged into one record).

    Records hold ``step`` and any of ``train_loss``, ``lr``, ``val_<task>/<metric>`` (with
    ``_stderr``), ``val_<metric>`` for a single task; ``[]`` when the run has no training log.
    """
    path = training_log_path(workspace, run_name)
    return [] if path is None else read_training_log(path)


def plot_curves(
    workspace: WorkspaceLike, run_names: Sequence[str], path: str | os.PathLike[str]
) -> list[str]:
    """Draw training loss and each task's validation metrics against step into ``path``.

    One panel for ``train_loss``, one per validation task (``val_<task>/<metric>``: accuracy
    solid, normalised accuracy dashed, ± stderr bars), one curve per training: runs that share a
    training step's log (reruns, or runs that only scored its model again) draw one curve, under
    the first one's name. Curves are labelled by the settings in which they differ
    (:func:`~.distinct.labels`: ``engine=fsdp2, devices=2``). The image format follows the suffix
    (PNG, PDF, SVG...). Runs without a training log are left out; returns the names drawn.
    Raises :class:`ResultsError` when none has one, or (before reading anything) for a suffix
    that is no image format (:func:`check_plot_path`).
    """
    check_plot_path(path)
    reader = open_workspace(workspace)
    names = list(dict.fromkeys(run_names))
    logs = {name: training_log_path(reader, name) for name in names}
    records = {name: read_training_log(log) for name, log in logs.items() if log is not None}
    drawn = [name for name in names if records.get(name)]
    if not drawn:
        raise ResultsError(
            "nothing to plot: none of the runs "
            f"({', '.join(names) or 'none given'}) has a training log"
        )
    first: dict[Any, str] = {}
    for name in drawn:
        first.setdefault(logs[name], name)
    label = labels(collect_runs(reader, list(first.values())))
    draw_curves({label[name]: records[name] for name in first.values()}, path)
    return drawn


def check_plot_path(path: str | os.PathLike[str]) -> None:
    """Raise :class:`ResultsError` (one line, naming the formats) unless ``path`` ends in a suffix
    matplotlib writes (without one, matplotlib would write ``path.png``)."""
    suffix = Path(path).suffix.lower().lstrip(".")
    formats = plot_formats()
    if suffix not in formats:
        what = f"'.{suffix}' is not a format matplotlib writes" if suffix else "it has no suffix"
        raise ResultsError(
            f"cannot plot to {os.fspath(path)}: {what}; end the file name with one of "
            + ", ".join(f".{name}" for name in formats)
        )


# --- one run ------------------------------------------------------------------------------------


class _UnreadableRun(ResultsError):
    """A registered run whose records cannot be read (the message says why, in one line)."""


def _registered_run(reader: WorkspaceReader, name: str) -> RunRecord:
    try:
        return reader.run(name)
    except ResultsError as error:
        raise _UnreadableRun(str(error)) from None
    except KeyError:
        known = sorted(reader.run_names())
        hint = f"; runs: {', '.join(known)}" if known else "; the workspace has no runs"
        raise ResultsError(f"no run named {name!r} in workspace {reader.url}{hint}") from None
