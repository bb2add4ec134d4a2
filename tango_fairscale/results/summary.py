"""One run's summary (:class:`RunSummary`): its configuration, its own status and timings, its
scored tasks and metrics, read from step infos, the metrics result and the training step's
``run_info.json`` (pure Python: no torch, no Tango); as JSON in lm-eval's shape."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..records.run_info import RunInfo, precision_label
from ..records.work_dir import RUN_INFO, TRAINING_LOG
from .metrics import TaskMetrics, task_metrics
from .run_state import StepStatus, run_status, step_statuses, wall_time
from .step_infos import StepRecord
from .workspace import RunRecord, WorkspaceReader

METRICS_STEP = "metrics"
"""Name of the step whose result holds the metrics (``tango_fairscale::task_metrics``)."""
TRAIN_STEP = "trained_model"
"""Name of the training step in the configs (absent when ``train_steps=0``)."""

_TRAIN = "tango_fairscale::train"
_SCORES = "tango_fairscale::task_scores"
_METRICS = "tango_fairscale::task_metrics"
_PREFIX = "tango_fairscale::"
# lm-eval's keys of a results JSON, copied into a run's JSON.
_LM_EVAL_KEYS = "results groups group_subtasks n-shot n-samples versions higher_is_better".split()


@dataclass(frozen=True)
class RunSummary:
    """One registered run: configuration, this run's status, timings and metrics.

    ``status`` is ``"completed"`` when the metrics step completed for this run and its result
    could be read, otherwise ``"failed: <steps>"``, ``"running"``, ``"interrupted: <steps>"``,
    ``"incomplete"``, ``"metrics result missing"`` or ``"no metrics step"``; ``error`` holds the
    first failed step's exception message. ``precision`` is what the training (else scoring)
    resolved when the run recorded it, else the configured name (``requested_precision``), then
    ``precision_recorded`` is false. ``wall_time_s`` runs from the start of the ``tango run``
    process (model loading included) to the run's last log line where the workspace recorded it,
    else it spans the steps this run executed itself (0 when it reused every result);
    ``train_time_s`` is the training step's duration, reused or not. ``metrics`` is the metrics
    step's result (lm-eval's JSON under ``"lm_eval"``). ``task_names`` are the scored tasks,
    ``limit`` the documents per task (``None``: all). ``reruns`` names the later runs that
    started no step and were folded into this one (:func:`~.distinct.fold_reruns`).
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
    task_names: tuple[str, ...] = ()
    limit: int | None = None
    reruns: tuple[str, ...] = ()

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


def summarise(reader: WorkspaceReader, run: RunRecord) -> RunSummary:
    statuses = step_statuses(reader, run)
    metrics = _metrics(reader, run, statuses)
    metrics_step = _metrics_step(run)
    status, error = run_status(
        statuses, metrics_step.name if metrics_step else None, metrics is not None
    )
    scores = [c for c in (s.config or {} for s in _scoring_order(run)) if c.get("type") == _SCORES]
    model = next((m for m in (_describe_model(c.get("model")) for c in scores) if m), None)
    common: dict[str, Any] = {
        **_tasks_and_limit(run, scores),
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
    log = train_file(reader, run, statuses, TRAINING_LOG)
    completed = train_status.state == "completed"
    return RunSummary(
        **common,
        model=_describe_model(train.get("model")) or model,
        engine=_strip_prefix(engine.get("type")),
        precision=info.precision
        or precision_label(engine.get("precision", "auto"), engine.get("float8")),
        device_count=info.world_size or _dict(train.get("runtime")).get("device_count", 1),
        train_steps=train.get("train_steps"),
        training_log=None if log is None else str(log),
        requested_precision=engine.get("precision", "auto"),
        precision_recorded=info.precision is not None,
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


def train_file(
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


def _run_info(reader: WorkspaceReader, run: RunRecord, statuses: dict[str, StepStatus]) -> RunInfo:
    return RunInfo.read(train_file(reader, run, statuses, RUN_INFO))


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


def _tasks_and_limit(run: RunRecord, scores: list[dict[str, Any]]) -> dict[str, Any]:
    """The scored tasks' names and their ``limit`` (a task's own, else the PIQA step's)."""
    specs = [score.get("task") for score in scores]
    names = tuple(dict.fromkeys(name for name in map(_task_name, specs) if name))
    limits = [spec.get("limit") for spec in specs if isinstance(spec, dict)]
    if not any(isinstance(value, int) for value in limits):
        limits = [(s.config or {}).get("limit") for s in run.steps.values()]
    numbers = [value for value in limits if isinstance(value, int)]
    limit = max(numbers) if numbers else None
    return {"task_names": names, "limit": limit}


def _task_name(spec: Any) -> str | None:
    if isinstance(spec, str):
        return spec
    if not isinstance(spec, dict):
        return None
    config = _dict(spec.get("config"))
    yaml = spec.get("yaml")
    name = spec.get("name") or config.get("task") or (Path(yaml).stem if yaml else None)
    return str(name) if name else None


def _scoring_order(run: RunRecord) -> list[StepRecord]:
    """The run's steps, those the metrics step lists (``scores: [{ref: NAME}, ...]``) first, in
    its order (the order of ``-D tasks``)."""
    metrics = _metrics_step(run)
    refs = _dict(metrics.config if metrics else None).get("scores")
    listed = [r.get("ref") for r in refs if isinstance(r, dict)] if isinstance(refs, list) else []
    first = [run.steps[name] for name in listed if name in run.steps]
    return first + [step for step in run.steps.values() if step not in first]


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
