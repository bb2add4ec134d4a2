"""Run summaries as plain-text tables: one row per run, then one row per run and task (lm-eval's
metrics with their standard errors)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .summary import RunSummary

__all__ = ["format_table"]

_MODEL_WIDTH = 40


def format_table(summaries: Sequence[RunSummary]) -> str:
    """Two aligned plain-text tables: one row per run (configuration, tasks and ``limit``, status,
    timings; ``(+N reruns)`` after a run that reruns were folded into), then one row per run and
    task (``value ± stderr`` per metric, examples); ``-`` where nothing applies."""
    header = [
        "run",
        "status",
        "started",
        "model",
        "tasks",
        "limit",
        "engine",
        "precision",
        "devices",
        "train steps",
        "batch",
        "lr",
        "seed",
        "train time",
        "wall time",
    ]
    rows = [
        [
            s.name + _reruns(len(s.reruns)),
            s.status,
            "-" if s.start_date is None else s.start_date.strftime("%Y-%m-%d %H:%M:%S"),
            _shorten(s.model),
            _tasks(s.task_names),
            "all" if s.limit is None and s.task_names else _cell(s.limit),
            _cell(s.engine),
            _precision(s),
            _cell(s.device_count),
            _cell(s.train_steps),
            _cell(s.batch_size),
            "-" if s.lr is None else f"{s.lr:g}",
            _cell(s.seed),
            _duration(s.train_time_s),
            "cached" if s.wall_time_s == 0 else _duration(s.wall_time_s),
        ]
        for s in summaries
    ]
    text = _align([header, *rows], numeric={5, *range(8, len(header))})
    per_task = [(s.name, task) for s in summaries for task in s.tasks]
    if not per_task:
        return text
    names = list(dict.fromkeys(name for _, task in per_task for name in task.values))
    header = ["run", "task", "n-shot", *names, "examples"]
    rows = [
        [
            run,
            task.task,
            _cell(task.n_shot),
            *(_with_stderr(*task.values.get(name, (None, None))) for name in names),
            _cell(task.examples),
        ]
        for run, task in per_task
    ]
    return text + "\n\n" + _align([header, *rows], numeric=set(range(2, len(header))))


# --- internals ---------------------------------------------------------------------------------


def _align(rows: list[list[str]], numeric: set[int]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
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


def _reruns(count: int) -> str:
    return "" if count == 0 else f" (+{count} rerun{'s' if count > 1 else ''})"


def _tasks(names: Sequence[str]) -> str:
    if not names:
        return "-"
    text = ",".join(names)
    return text if len(text) <= 30 else f"{','.join(names[:2])},… ({len(names)})"


def _precision(summary: RunSummary) -> str:
    if summary.precision == "auto" and not summary.precision_recorded:
        return "auto (unrecorded)"
    return _cell(summary.precision)


def _shorten(text: str | None) -> str:
    if text is None:
        return "-"
    return text if len(text) <= _MODEL_WIDTH else "…" + text[-(_MODEL_WIDTH - 1) :]


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _with_stderr(value: float | None, stderr: float | None) -> str:
    if value is None:
        return "-"
    if stderr is not None and not math.isnan(stderr):
        return f"{value:.4f} ± {stderr:.4f}"
    return f"{value:.4f}"
