"""A ``task_metrics`` result as per-task rows (:class:`TaskMetrics`): from lm-eval's results JSON
when it holds one, else from its flat ``<task>/<metric>`` keys."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_NOT_METRICS = {"num_examples"}


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


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
