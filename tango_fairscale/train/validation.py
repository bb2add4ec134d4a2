"""In-training validation: the evaluator through which every rank answers its share of the
validation tasks, lm-eval's metrics of a pass, and their one-line description."""

from __future__ import annotations

from typing import Any

from ..evaluation.call import EvalOptions, ModelCall
from ..evaluation.evaluator import Evaluator
from ..evaluation.harness import merge, summary
from ..parallel.engine import Engine
from .plan import TrainPlan


def evaluator(engine: Engine, plan: TrainPlan) -> Evaluator:
    """The evaluator of validation: every rank answering its share through the engine."""
    options = EvalOptions(
        batch_size=plan.runtime.eval_batch_size,
        packed=plan.packed,
        progress=plan.config.is_local_main_process,
    )
    return Evaluator(ModelCall.of_engine(engine), options, plan.generation)


def validate(engine: Engine, evaluator: Evaluator, tasks: list) -> dict[str, Any]:
    """lm-eval's metrics of the validation tasks (the flat summary of
    :func:`~tango_fairscale.evaluation.harness.summary`), every rank answering its share through
    the engine."""
    engine.model.eval()
    try:
        results = [evaluator.evaluate(spec, loaded, samples=False) for spec, loaded in tasks]
        return summary(merge(results))
    finally:
        engine.model.train()


def first_metric(metrics: dict[str, Any]) -> str:
    """The default ``val_metric``: the first task's first metric (``acc`` for most tasks)."""
    return next((key for key in metrics if "/" in key and "stderr" not in key), "")


def describe_validation(metrics: dict[str, Any]) -> str:
    """``task: metric value ± stderr, ... (N examples); task: ...`` of a validation's flat
    summary (:func:`~tango_fairscale.evaluation.harness.summary`)."""
    tasks: dict[str, list[str]] = {}
    examples: dict[str, Any] = {}
    for key, value in metrics.items():
        task, _, metric = key.rpartition("/")
        if not task or metric.endswith("_stderr") or not isinstance(value, (int, float)):
            continue
        if metric == "num_examples":
            examples[task] = value
            continue
        stderr = metrics.get(f"{key}_stderr")
        spread = f" ± {stderr:.4f}" if isinstance(stderr, (int, float)) else ""
        tasks.setdefault(task, []).append(f"{metric} {value:.4f}{spread}")
    return "; ".join(
        f"{task}: {', '.join(shown)}"
        + (f" ({examples[task]} examples)" if task in examples else "")
        for task, shown in tasks.items()
    )
