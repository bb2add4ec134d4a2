"""Inspect finished runs of ``configs/gpt2_piqa.jsonnet`` through Tango's ``Workspace`` API.

Everything is read through the workspace: runs and their step infos (``StepInfo.config`` gives
the engine, precision, device count, train steps and model), the ``metrics`` step's result, and
the ``training_log.jsonl`` inside the ``trained_model`` step's result directory. Model weights are
never loaded.

::

    from tango_fairscale.results import collect_runs, format_table, plot_curves
    summaries = collect_runs("workspace")
    print(format_table(summaries))
    plot_curves("workspace", [s.name for s in summaries], "curves.png")
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Union
from urllib.parse import urlparse

from tango import Workspace
from tango.common.registrable import Registrable
from tango.step_info import StepInfo, StepState
from tango.workspace import Run
from tango.workspaces import LocalWorkspace

from .train.log import TRAINING_LOG, read_training_log

__all__ = [
    "METRICS_STEP",
    "TRAIN_STEP",
    "ResultsError",
    "RunSummary",
    "collect_runs",
    "format_table",
    "open_workspace",
    "plot_curves",
    "training_curves",
    "training_log_path",
]

METRICS_STEP = "metrics"
"""Name of the step whose result holds ``acc``, ``acc_norm``, ... in the config."""
TRAIN_STEP = "trained_model"
"""Name of the training step in the config (absent when ``train_steps=0``)."""

_TRAIN_TYPE = "tango_fairscale::train"
_PREDICTIONS_TYPE = "tango_fairscale::task_scores"
_PREFIX = "tango_fairscale::"
# Workspace types registered by Tango's integrations when they are imported.
_INTEGRATION_WORKSPACES = {"beaker", "gs", "wandb"}

WorkspaceLike = Union[Workspace, str, "os.PathLike[str]"]


class ResultsError(Exception):
    """A request that cannot be answered (no workspace, no runs, unknown run, nothing to plot).

    The message is one line, meant for the user as it is.
    """


@dataclass(frozen=True)
class RunSummary:
    """One registered run: its configuration, state and PIQA validation metrics.

    ``status`` is ``"completed"`` when the ``metrics`` result could be read, otherwise
    ``"failed: <steps>"``, ``"running"``, ``"incomplete"``, ``"metrics result missing"`` or
    ``"no metrics step"``; ``metrics`` is then ``None`` and ``error`` holds the last line of the
    first failed step's error, if any. ``train_steps`` is 0 for an evaluation-only run, whose
    ``engine``, ``precision`` and ``device_count`` are ``None``. ``training_log`` is the location
    of the run's ``training_log.jsonl`` when it exists.
    """

    name: str
    status: str
    start_date: datetime | None
    model: str | None
    engine: str | None
    precision: str | None
    device_count: int | None
    train_steps: int | None
    metrics: dict[str, Any] | None
    training_log: str | None = None
    error: str | None = None

    @property
    def acc(self) -> float | None:
        return None if self.metrics is None else self.metrics.get("acc")

    @property
    def acc_norm(self) -> float | None:
        return None if self.metrics is None else self.metrics.get("acc_norm")

    @property
    def num_examples(self) -> int | None:
        return None if self.metrics is None else self.metrics.get("num_examples")

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict of every field (dates as ISO strings, NaN as ``None``)."""
        data = asdict(self)
        data["start_date"] = None if self.start_date is None else self.start_date.isoformat()
        if self.metrics is not None:
            data["metrics"] = {key: _json_number(value) for key, value in self.metrics.items()}
        return data


def open_workspace(workspace: WorkspaceLike) -> Workspace:
    """A ``Workspace`` from an instance, a URL (``local:///tmp/ws``) or a plain local path.

    Raises :class:`ResultsError` when a local workspace does not exist, instead of creating an
    empty one the way ``Workspace.from_url`` does.
    """
    if isinstance(workspace, Workspace):
        return workspace
    url = os.fspath(workspace)
    parsed = urlparse(url)
    if parsed.scheme in ("", "local"):
        directory = Path(parsed.netloc) / parsed.path.lstrip("/") if parsed.netloc else None
        directory = directory or Path(parsed.path or ".")
        if not (directory / "runs").is_dir():
            raise ResultsError(f"no Tango workspace at {url!r} (expected a directory with runs/)")
    else:
        registered = set(Registrable._registry[Workspace]) - {"from_url"}
        known = sorted(registered | _INTEGRATION_WORKSPACES)
        if parsed.scheme not in known:
            raise ResultsError(
                f"unknown workspace type {parsed.scheme!r} in {url!r}; choose one of "
                f"{', '.join(known)} (or give a directory)"
            )
    try:
        return Workspace.from_url(url)
    except Exception as error:  # unknown scheme, missing integration, unreachable store
        raise ResultsError(f"cannot open workspace {url!r}: {_one_line(error)}") from error


def collect_runs(
    workspace: WorkspaceLike, run_names: Iterable[str] | None = None
) -> list[RunSummary]:
    """Summaries of the named runs in that order, or of all runs ordered by start date.

    Raises :class:`ResultsError` for an unknown run name or a workspace without runs. Runs that
    failed or did not finish are summarised with their status, never raised.
    """
    ws = open_workspace(workspace)
    if run_names is None:
        runs = sorted(ws.registered_runs().values(), key=lambda r: (r.start_date, r.name))
        if not runs:
            raise ResultsError(f"workspace {ws.url} has no registered runs")
    else:
        runs = [_registered_run(ws, name) for name in dict.fromkeys(run_names)]
    return [_summarise(ws, run) for run in runs]


def training_log_path(workspace: WorkspaceLike, run_name: str) -> Path | None:
    """The run's ``training_log.jsonl``, or ``None`` when the run did not train or logged nothing.

    For a finished training step this is the file in the step's ``result_location``; for a
    running or failed one in a local workspace, the log being written in the step's work dir.
    """
    ws = open_workspace(workspace)
    return _log_path(ws, _registered_run(ws, run_name))


def training_curves(workspace: WorkspaceLike, run_name: str) -> list[dict[str, Any]]:
    """The run's training log records ordered by step, a replayed step merged into one record.

    Records hold ``step`` and any of ``train_loss``, ``lr``, ``val_acc``, ``val_acc_norm``,
    ``val_num_examples``; ``[]`` when the run has no training log (e.g. ``train_steps=0``).
    """
    path = training_log_path(workspace, run_name)
    return [] if path is None else read_training_log(path)


def plot_curves(
    workspace: WorkspaceLike, run_names: Sequence[str], path: str | os.PathLike[str]
) -> list[str]:
    """Draw training loss and validation accuracy against step, one line per run, into ``path``.

    Left panel: ``train_loss``; right panel: ``val_acc`` (solid) and ``val_acc_norm`` (dashed).
    The image format follows the file suffix (PNG, PDF, SVG...). Runs without a training log are
    left out; returns the names of the runs drawn. Raises :class:`ResultsError` when none has one.
    """
    ws = open_workspace(workspace)
    curves = {name: training_curves(ws, name) for name in dict.fromkeys(run_names)}
    drawn = {name: records for name, records in curves.items() if records}
    if not drawn:
        raise ResultsError(
            "nothing to plot: none of the runs "
            f"({', '.join(curves) or 'none given'}) has a training log"
        )

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(figure)
    loss_axes, acc_axes = figure.subplots(1, 2)
    palette = [f"C{index % 10}" for index in range(len(drawn))]
    has_validation = False
    for color, (name, records) in zip(palette, drawn.items(), strict=True):
        steps, losses = _series(records, "train_loss")
        if steps:
            loss_axes.plot(steps, losses, marker="o", markersize=3, color=color, label=name)
        for key, style, suffix in (("val_acc", "-", "acc"), ("val_acc_norm", "--", "acc_norm")):
            steps, values = _series(records, key)
            if steps:
                has_validation = True
                acc_axes.plot(
                    steps,
                    values,
                    style,
                    marker="o",
                    markersize=3,
                    color=color,
                    label=f"{name} ({suffix})",
                )
    loss_axes.set(title="Training loss", xlabel="optimizer step", ylabel="train loss")
    acc_axes.set(title="PIQA validation accuracy", xlabel="optimizer step", ylabel="accuracy")
    for axes in (loss_axes, acc_axes):
        axes.grid(True, alpha=0.3)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        if axes.get_lines():
            axes.legend(fontsize="small")
    if not has_validation:
        acc_axes.text(
            0.5, 0.5, "no validation logged", ha="center", va="center", transform=acc_axes.transAxes
        )
    figure.savefig(os.fspath(path), dpi=120)
    return list(drawn)


def format_table(summaries: Sequence[RunSummary]) -> str:
    """An aligned plain-text table: one row per run, ``-`` where a value does not apply."""
    header = [
        "run",
        "status",
        "model",
        "engine",
        "precision",
        "devices",
        "train steps",
        "acc",
        "acc_norm",
        "examples",
    ]
    rows = [header]
    for s in summaries:
        metrics = s.metrics or {}
        rows.append(
            [
                s.name,
                s.status,
                _cell(s.model),
                _cell(s.engine),
                _cell(s.precision),
                _cell(s.device_count),
                _cell(s.train_steps),
                _with_stderr(metrics.get("acc"), metrics.get("acc_stderr")),
                _with_stderr(metrics.get("acc_norm"), metrics.get("acc_norm_stderr")),
                _cell(metrics.get("num_examples")),
            ]
        )
    numeric = {5, 6, 7, 8, 9}
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for index, row in enumerate(rows):
        cells = [
            cell.rjust(width) if column in numeric else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


# --- internals ---------------------------------------------------------------------------------


def _registered_run(ws: Workspace, name: str) -> Run:
    try:
        return ws.registered_run(name)
    except KeyError:
        known = sorted(ws.registered_runs())
        hint = f"; runs: {', '.join(known)}" if known else "; the workspace has no runs"
        raise ResultsError(f"no run named {name!r} in workspace {ws.url}{hint}") from None


def _summarise(ws: Workspace, run: Run) -> RunSummary:
    train = _train_step(run)
    train_config = (train.config or {}) if train is not None else {}
    engine = train_config.get("engine") if isinstance(train_config.get("engine"), dict) else None
    metrics = _metrics(ws, run)
    if train is not None:
        model = _describe_model(train_config.get("model"))
        train_steps = train_config.get("train_steps")
        device_count = train_config.get("device_count", 1)
    else:
        model = next(
            (
                m
                for m in (
                    _describe_model((info.config or {}).get("model"))
                    for info in _steps_of_type(run, _PREDICTIONS_TYPE)
                )
                if m
            ),
            None,
        )
        train_steps, device_count = 0, None
    log = _log_path(ws, run)
    return RunSummary(
        name=run.name,
        status="completed" if metrics is not None else _status(run),
        start_date=run.start_date,
        model=model,
        engine=_strip_prefix(engine.get("type")) if engine else None,
        precision=engine.get("precision", "auto") if engine else None,
        device_count=device_count,
        train_steps=train_steps,
        metrics=metrics,
        training_log=None if log is None else str(log),
        error=None if metrics is not None else _first_error(run),
    )


def _metrics(ws: Workspace, run: Run) -> dict[str, Any] | None:
    info = run.steps.get(METRICS_STEP)
    if info is None or _state(info) != StepState.COMPLETED:
        return None
    try:
        result = ws.step_result_for_run(run.name, METRICS_STEP)
    except (KeyError, OSError, ValueError):
        return None
    return dict(result) if isinstance(result, dict) else None


def _status(run: Run) -> str:
    states = {name: _state(info) for name, info in run.steps.items()}
    failed = sorted(name for name, state in states.items() if state == StepState.FAILED)
    if failed:
        return "failed: " + ", ".join(failed)
    if StepState.RUNNING in states.values():
        return "running"
    if METRICS_STEP not in states:
        return "no metrics step"
    if states[METRICS_STEP] == StepState.COMPLETED:
        return "metrics result missing"
    return "incomplete"


def _state(info: StepInfo) -> StepState | None:
    try:
        return info.state
    except RuntimeError:  # inconsistent times / error fields
        return None


def _first_error(run: Run) -> str | None:
    for name in sorted(run.steps):
        error = run.steps[name].error
        if error:
            lines = [line.strip() for line in str(error).splitlines() if line.strip()]
            return f"{name}: {lines[-1]}" if lines else name
    return None


def _train_step(run: Run) -> StepInfo | None:
    if TRAIN_STEP in run.steps:
        return run.steps[TRAIN_STEP]
    return next(iter(_steps_of_type(run, _TRAIN_TYPE)), None)


def _steps_of_type(run: Run, step_type: str) -> list[StepInfo]:
    return [
        run.steps[name]
        for name in sorted(run.steps)
        if (run.steps[name].config or {}).get("type") == step_type
    ]


def _log_path(ws: Workspace, run: Run) -> Path | None:
    info = _train_step(run)
    if info is None:
        return None
    candidates: list[Path] = []
    if info.result_location and _state(info) == StepState.COMPLETED:
        parsed = urlparse(info.result_location)
        if parsed.scheme in ("", "file", "local"):
            candidates.append(Path(parsed.path if parsed.scheme else info.result_location))
    if isinstance(ws, LocalWorkspace):
        candidates.append(ws.step_dir(info.unique_id))  # where results are stored
        candidates.append(ws.step_dir(info.unique_id) / "work")  # the log of a running step
    for directory in candidates:
        if (directory / TRAINING_LOG).is_file():
            return directory / TRAINING_LOG
    return None


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


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


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _with_stderr(value: Any, stderr: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    if isinstance(stderr, (int, float)) and not math.isnan(stderr):
        return f"{value:.4f} ± {stderr:.4f}"
    return f"{value:.4f}"


def _json_number(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__
