"""Views of run summaries: lm-eval's results as per-task rows, the runs and metrics tables, and the
JSON of a run in lm-eval's shape."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .summary import RunSummary

__all__ = ["TaskMetrics", "format_table", "run_json", "task_metrics"]

_NOT_METRICS = {"num_examples"}
# lm-eval's keys of a results JSON, copied into a run's JSON.
_LM_EVAL_KEYS = "results groups group_subtasks n-shot n-samples versions higher_is_better".split()
_MODEL_WIDTH = 40


@dataclass(frozen=True)
class TaskMetrics:
    """One task's (or group's) metrics: ``values[metric] = (value, stderr)``, lm-eval's names
    (``metric,filter`` where the filter is not ``none``); ``None`` where lm-eval gives none."""

    task: str
    values: dict[str, tuple[float | None, float | None]]
    n_shot: int | None = None
    examples: int | None = None
    group: bool = False


def task_metrics(metrics: Mapping[str, Any] | None) -> list[TaskMetrics]:
    """Rows of a ``task_metrics`` result: from lm-eval's JSON under ``"lm_eval"`` when present
    (tasks in lm-eval's order, then groups), else from the flat ``<task>/<metric>`` keys."""
    if not metrics:
        return []
    lm_eval = metrics.get("lm_eval")
    if isinstance(lm_eval, dict) and isinstance(lm_eval.get("results"), dict):
        return _lm_eval_rows(lm_eval)
    per_task: dict[str, dict[str, Any]] = {}
    for key, value in metrics.items():
        if "/" in key:
            task, metric = key.split("/", 1)
            per_task.setdefault(task, {})[metric] = value
    if not per_task and any(key in metrics for key in ("acc", "acc_norm")):
        per_task["-"] = dict(metrics)
    return [
        TaskMetrics(
            task,
            {
                name: (_number(value), _number(flat.get(f"{name}_stderr")))
                for name, value in flat.items()
                if not name.endswith("_stderr") and name not in _NOT_METRICS and name != "lm_eval"
            },
            examples=_integer(flat.get("num_examples")),
        )
        for task, flat in per_task.items()
    ]


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


def run_json(summary: RunSummary) -> dict[str, Any]:
    """``summary`` in lm-eval's shape: the run's fields, ``config`` (the run's configuration over
    lm-eval's ``config`` if any), ``steps``, the flat ``metrics`` and lm-eval's ``results``,
    ``groups``, ``n-shot``, ``n-samples``, ...; NaN as ``None``."""
    config = {
        "model": summary.model,
        "engine": summary.engine,
        "precision": summary.precision,
        "requested_precision": summary.requested_precision,
        "precision_recorded": summary.precision_recorded,
        "device_count": summary.device_count,
        "train_steps": summary.train_steps,
        "batch_size": summary.batch_size,
        "lr": summary.lr,
        "seed": summary.seed,
        "tasks": list(summary.task_names),
        "limit": summary.limit,
        "host": summary.host,
    }
    steps = {}
    for name, status in summary.steps.items():
        times = status.own or status.reused  # else the record is not this run's
        steps[name] = {
            "state": status.state,
            "reused": status.reused,
            "unique_id": status.record.unique_id,
            "start_time": _iso(status.record.start_time) if times else None,
            "end_time": _iso(status.record.end_time) if times else None,
        }
    data: dict[str, Any] = {
        "name": summary.name,
        "status": summary.status,
        "error": summary.error,
        "start_date": _iso(summary.start_date),
        "wall_time_s": summary.wall_time_s,
        "train_time_s": summary.train_time_s,
        "training_log": summary.training_log,
        "reruns": list(summary.reruns),
        "config": config,
        "steps": steps,
        "metrics": None,
    }
    if summary.metrics is not None:
        data["metrics"] = {k: v for k, v in summary.metrics.items() if k != "lm_eval"}
        lm_eval = summary.lm_eval
        data.update({key: lm_eval[key] for key in _LM_EVAL_KEYS if key in lm_eval})
        lm_config = lm_eval.get("config")
        data["config"] = {**(lm_config if isinstance(lm_config, dict) else {}), **config}
    return _json_safe(data)


# --- internals ---------------------------------------------------------------------------------


def _lm_eval_rows(lm_eval: Mapping[str, Any]) -> list[TaskMetrics]:
    results = dict(lm_eval.get("results") or {})
    groups = dict(lm_eval.get("groups") or {})
    n_shot = lm_eval.get("n-shot") or {}
    n_samples = lm_eval.get("n-samples") or {}
    rows = []
    for task, entry in {**results, **{k: v for k, v in groups.items() if k not in results}}.items():
        if not isinstance(entry, dict):
            continue
        values = {}
        for key, value in entry.items():
            metric, _, filter_ = key.partition(",")
            if filter_ and not metric.endswith("_stderr"):
                name = metric if filter_ == "none" else key
                values[name] = (_number(value), _number(entry.get(f"{metric}_stderr,{filter_}")))
        samples = n_samples.get(task)
        examples = samples.get("effective") if isinstance(samples, dict) else None
        rows.append(
            TaskMetrics(
                task,
                values,
                n_shot=_integer(n_shot.get(task)),
                examples=_integer(examples if examples is not None else entry.get("sample_len")),
                group=task in groups,
            )
        )
    return rows


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


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value
