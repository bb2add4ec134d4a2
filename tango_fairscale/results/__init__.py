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

import datetime as dt
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from ..train.log import TRAINING_LOG, read_training_log
from .report import TaskMetrics, draw_curves, format_table, plot_formats, run_json, task_metrics
from .run_state import StepStatus, run_status, step_statuses, wall_time
from .step_infos import StepRecord
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
    "format_table",
    "open_workspace",
    "plot_curves",
    "training_curves",
    "training_log_path",
]

METRICS_STEP = "metrics"
"""Name of the step whose result holds the metrics (``tango_fairscale::task_metrics``)."""
TRAIN_STEP = "trained_model"
"""Name of the training step in the configs (absent when ``train_steps=0``)."""
RUN_INFO = "run_info.json"
"""Optional file of the training step (result or work dir): what it resolved, e.g.
``{"precision": "bf16-mixed", "device": "cuda"}``; read when present."""

_TRAIN = "tango_fairscale::train"
_SCORES = "tango_fairscale::task_scores"
_METRICS = "tango_fairscale::task_metrics"
_PREFIX = "tango_fairscale::"
WorkspaceLike = Union[WorkspaceReader, Any, str, "os.PathLike[str]"]


@dataclass(frozen=True)
class RunSummary:
    """One registered run: configuration, this run's status, timings and metrics.

    ``status`` is ``"completed"`` when the metrics step completed for this run and its result
    could be read, otherwise ``"failed: <steps>"``, ``"running"``, ``"interrupted: <steps>"``,
    ``"incomplete"``, ``"metrics result missing"`` or ``"no metrics step"``; ``error`` holds the
    first failed step's exception message. ``precision`` is what the training (else scoring)
    resolved when the run recorded it, else the configured name (``requested_precision``), then
    ``precision_recorded`` is false. ``wall_time_s`` spans the steps this run executed itself
    (0 when it reused every result); ``train_time_s`` is the training step's duration, reused
    or not. ``metrics`` is the metrics step's result (lm-eval's JSON under ``"lm_eval"``).
    """

    name: str
    status: str
    start_date: dt.datetime | None
    model: str | None
    engine: str | None
    precision: str | None
    device_count: int | None
    train_steps: int | None
    metrics: dict[str, Any] | None
    training_log: str | None = None
    error: str | None = None
    requested_precision: str | None = None
    precision_recorded: bool = False
    batch_size: int | None = None
    lr: float | None = None
    seed: int | None = None
    wall_time_s: float | None = None
    train_time_s: float | None = None
    host: str | None = None
    steps: dict[str, StepStatus] = field(default_factory=dict)

    @property
    def acc(self) -> float | None:
        return None if self.metrics is None else self.metrics.get("acc")

    @property
    def acc_norm(self) -> float | None:
        return None if self.metrics is None else self.metrics.get("acc_norm")

    @property
    def num_examples(self) -> int | None:
        return None if self.metrics is None else self.metrics.get("num_examples")

    @property
    def tasks(self) -> list[TaskMetrics]:
        """Each task's (and group's) metrics with their standard errors, in lm-eval's order."""
        return task_metrics(self.metrics)

    @property
    def lm_eval(self) -> dict[str, Any]:
        """lm-eval's results JSON of the metrics (``{}`` without metrics)."""
        value = (self.metrics or {}).get("lm_eval")
        return value if isinstance(value, dict) else {}

    def to_json(self) -> dict[str, Any]:
        """The run in lm-eval's shape: its fields, ``config``, ``steps``, the flat ``metrics`` and
        lm-eval's ``results``, ``groups``, ``n-shot``, ``n-samples``, ... (NaN as ``None``)."""
        return run_json(self)


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
            summaries.append(_summarise(reader, _registered_run(reader, name)))
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
    return _train_file(reader, run, step_statuses(reader, run), TRAINING_LOG)


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
    solid, normalised accuracy dashed, ± stderr shaded), one colour per run. The image format
    follows the suffix (PNG, PDF, SVG...). Runs without a training log are left out; returns the
    names drawn. Raises :class:`ResultsError` when none has one, or (before reading anything) for
    a suffix that is no image format (:func:`check_plot_path`).
    """
    check_plot_path(path)
    reader = open_workspace(workspace)
    curves = {name: training_curves(reader, name) for name in dict.fromkeys(run_names)}
    drawn = {name: records for name, records in curves.items() if records}
    if not drawn:
        raise ResultsError(
            "nothing to plot: none of the runs "
            f"({', '.join(curves) or 'none given'}) has a training log"
        )
    draw_curves(drawn, path)
    return list(drawn)


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


def _summarise(reader: WorkspaceReader, run: RunRecord) -> RunSummary:
    statuses = step_statuses(reader, run)
    metrics = _metrics(reader, run, statuses)
    metrics_step = _metrics_step(run)
    status, error = run_status(
        statuses, metrics_step.name if metrics_step else None, metrics is not None
    )
    scores = [c for c in (s.config or {} for s in run.steps.values()) if c.get("type") == _SCORES]
    model = next((m for m in (_describe_model(c.get("model")) for c in scores) if m), None)
    common: dict[str, Any] = {
        "name": run.name,
        "status": status,
        "start_date": run.start_date,
        "metrics": metrics,
        "error": error,
        "wall_time_s": wall_time(run, statuses),
        "steps": statuses,
    }
    train_name = _train_step_name(run)
    if train_name is None:  # scoring only: the precision of the scoring steps
        requested = next((c.get("precision", "32-true") for c in scores), None)
        recorded = _dict(_dict(_dict(metrics).get("lm_eval")).get("config")).get("precision")
        host = None if metrics_step is None else metrics_step.host
        return RunSummary(
            **common,
            model=model,
            engine=None,
            precision=recorded or requested,
            device_count=None,
            train_steps=0,
            requested_precision=requested,
            precision_recorded=bool(recorded),
            host=host,
        )
    train, train_status = _dict(run.steps[train_name].config), statuses[train_name]
    engine = _dict(train.get("engine"))
    info = _run_info(reader, run, statuses)
    log = _train_file(reader, run, statuses, TRAINING_LOG)
    completed = train_status.state == "completed"
    return RunSummary(
        **common,
        model=_describe_model(train.get("model")) or model,
        engine=_strip_prefix(engine.get("type")),
        precision=info.get("precision") or engine.get("precision", "auto"),
        device_count=info.get("world_size", train.get("device_count", 1)),
        train_steps=train.get("train_steps"),
        training_log=None if log is None else str(log),
        requested_precision=engine.get("precision", "auto"),
        precision_recorded=bool(info.get("precision")),
        batch_size=train.get("batch_size"),
        lr=_dict(engine.get("optimizer")).get("lr"),
        seed=train.get("seed"),
        train_time_s=train_status.record.duration_s if completed else None,
        host=train_status.record.host,
    )


def _metrics(
    reader: WorkspaceReader, run: RunRecord, statuses: dict[str, StepStatus]
) -> dict[str, Any] | None:
    step = _metrics_step(run)
    if step is None or statuses[step.name].state != "completed":
        return None
    try:
        result = reader.result(run, step.name)
    except (KeyError, OSError, ValueError):
        return None
    return dict(result) if isinstance(result, dict) else None


def _metrics_step(run: RunRecord) -> StepRecord | None:
    if METRICS_STEP in run.steps:
        return run.steps[METRICS_STEP]
    return next((s for s in run.steps.values() if (s.config or {}).get("type") == _METRICS), None)


def _train_step_name(run: RunRecord) -> str | None:
    if TRAIN_STEP in run.steps:
        return TRAIN_STEP
    names = sorted(n for n, s in run.steps.items() if (s.config or {}).get("type") == _TRAIN)
    return names[0] if names else None


def _train_file(
    reader: WorkspaceReader, run: RunRecord, statuses: dict[str, StepStatus], name: str
) -> Path | None:
    """The training step's file ``name`` (result dir, then work dir), unless a later run redid
    the step (its directory then holds that run's files)."""
    step_name = _train_step_name(run)
    if step_name is None:
        return None
    status = statuses[step_name]
    if not (status.own or status.reused):
        return None
    for directory in reader.step_dirs(status.record):
        if (directory / name).is_file():
            return directory / name
    return None


def _run_info(
    reader: WorkspaceReader, run: RunRecord, statuses: dict[str, StepStatus]
) -> dict[str, Any]:
    path = _train_file(reader, run, statuses, RUN_INFO)
    try:
        info = json.loads(path.read_text()) if path is not None else {}
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _describe_model(config: Any) -> str | None:
    if not isinstance(config, dict) or config.get("type") == "ref":
        return None
    if config.get("model"):
        return str(config["model"])
    inner = config.get("config")
    if isinstance(inner, dict):
        return f"random {inner.get('model_type', 'model')}"
    return None


def _strip_prefix(name: Any) -> str | None:
    if not isinstance(name, str):
        return None
    return name[len(_PREFIX) :] if name.startswith(_PREFIX) else name
