"""Training and per-task validation curves of runs' training logs (matplotlib, imported only to
draw): one curve per run, labelled as the caller says, each validation point with its standard
error as an error bar, the runs' points set slightly apart so that overlapping bars stay
readable."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["draw_curves", "plot_formats"]

_NOT_METRICS = {"num_examples"}
#: How far apart the runs' validation points are set, as a share of the steps drawn.
_DODGE = 0.008


def plot_formats() -> list[str]:
    """The file suffixes (without the dot) that :func:`draw_curves` writes, as matplotlib says."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    return sorted(FigureCanvasAgg.get_supported_filetypes())


def draw_curves(
    curves: Mapping[str, Sequence[Mapping[str, Any]]], path: str | os.PathLike[str]
) -> None:
    """Draw ``train_loss`` and each task's validation metrics of each curve's log records
    (``{label: records}``) into ``path``: accuracy solid, normalised accuracy dashed, the first
    metric of each task with ± stderr bars."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    series = {label: _validation(records) for label, records in curves.items()}
    tasks = list(dict.fromkeys(task for per_run in series.values() for task in per_run))
    columns = min(3, 1 + max(1, len(tasks)))
    rows = math.ceil((1 + max(1, len(tasks))) / columns)
    figure = Figure(figsize=(4.6 * columns, 3.8 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = list(figure.subplots(rows, columns, squeeze=False).flat)
    loss_axes, task_axes = axes[0], dict(zip(tasks, axes[1:], strict=False))
    span = max((r["step"] for records in curves.values() for r in records), default=1)
    for index, (label, records) in enumerate(curves.items()):
        color = f"C{index % 10}"
        steps, losses = _series(records, "train_loss")
        if steps:
            loss_axes.plot(steps, losses, marker="o", markersize=3, color=color, label=label)
        shift = (index - (len(curves) - 1) / 2) * _DODGE * span
        for task, metrics in series[label].items():
            for position, metric in enumerate(metrics):
                steps, values = _series(records, metrics[metric])
                style = {"acc": "-", "acc_norm": "--"}.get(metric, ("-.", ":")[position % 2])
                _, stderrs = _series(records, metrics[metric] + "_stderr")
                bars = stderrs if position == 0 and len(stderrs) == len(values) else None
                task_axes[task].errorbar(
                    [step + shift for step in steps],
                    values,
                    yerr=bars,
                    fmt=style,
                    marker="o",
                    markersize=3,
                    capsize=3 if bars else 0,
                    color=color,
                    label=f"{label} ({metric})",
                )
    _finish(axes, loss_axes, task_axes, MaxNLocator)
    figure.savefig(os.fspath(path), dpi=120)


def _finish(axes: list, loss_axes: Any, task_axes: dict[str, Any], locator: Any) -> None:
    loss_axes.set(title="Training loss", xlabel="optimizer step", ylabel="train loss")
    for task, task_axis in task_axes.items():
        task_axis.set(title=f"{task} (validation, ± stderr)", xlabel="optimizer step")
    for axis in axes[1 + len(task_axes) :]:
        axis.set_axis_off()
    if not task_axes:
        axes[1].set_axis_on()
        axes[1].text(
            0.5, 0.5, "no validation logged", ha="center", va="center", transform=axes[1].transAxes
        )
    for axis in axes[: 1 + len(task_axes)]:
        axis.grid(True, alpha=0.3)
        axis.xaxis.set_major_locator(locator(integer=True))
        if axis.get_lines():
            axis.legend(fontsize="small")


def _validation(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """``{task: {metric: log key}}`` of the validation metrics in the records: ``val_<task>/<m>``,
    or ``val_<m>`` as task ``validation`` in logs without per-task keys."""
    keys = list(
        dict.fromkeys(key for record in records for key in record if key.startswith("val_"))
    )
    per_task = [k for k in keys if "/" in k]
    found: dict[str, dict[str, str]] = {}
    for key in per_task or keys:
        task, _, metric = key[len("val_") :].rpartition("/")
        if not metric.endswith("_stderr") and metric not in _NOT_METRICS:
            found.setdefault(task or "validation", {})[metric] = key
    return found


def _series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pairs], [p[1] for p in pairs]
